// A small data-parallel trainer that uses comms as its collective layer.
//
// It fits a linear or two-layer model to deterministic synthetic data. Each
// step uses the same global batch whatever the world size; every rank takes a
// contiguous slice of it, gradients are averaged with all_reduce(avg), and
// the parameters start from rank 0's by broadcast. So the loss curve, and the
// final_loss line, agree across world sizes up to floating-point rounding.
//
// With --parallel tp=2,dp=2 (or any Megatron layout) it builds a
// model-parallel collection and averages over its dp group instead.
//
// With --elastic it survives a lost rank: a step whose all_reduce failed,
// or that not every rank completed (a per-step commit vote), is redone on
// the survivors after comms::recover(). Each rank's share of the batch is a
// function of (rank, world size) of the comm in force and the reduction is a
// plain sum in a fixed order, so a run that loses rank R at step K ends with
// the same final_loss, to the bit, as one that shrinks R away by plan just
// before step K (--fail-rank/--fail-step vs --shrink-rank/--shrink-step).
//
// The backend comes from COMMS_BACKEND (default: Gloo on CPU) and the route
// that creates groups from COMMS_ROUTE (direct or split), so switching either
// needs no code change.
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "comms/comms.h"

namespace {

constexpr int kInputs = 16;

// SIGTERM and SIGINT (the launcher's stop, Ctrl-C). The main loop checks
// requested() after each step's collectives, so a rank whose peer died
// reports the collective's error, not the signal. But a rank blocked in a
// collective or a rendezvous (a reload waiting for a stopped peer) would
// only notice at its timeout, minutes later. So a thread takes the signals,
// and if the main thread has not ended kGraceMs after one (or at a second
// one), it ends the process itself, saying where the main thread was.
class StopWatcher {
 public:
  static constexpr int kGraceMs = 2000;

  // Blocks the signals before any other thread exists (the library's threads
  // inherit the mask), so only the watcher's signalfd receives them.
  StopWatcher() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC);
    done_fd_ = eventfd(0, EFD_CLOEXEC);
    if (signal_fd_ < 0 || done_fd_ < 0) {
      std::fprintf(stderr, "trainer: cannot watch for SIGTERM/SIGINT: %s\n", std::strerror(errno));
      std::exit(1);
    }
    thread_ = std::thread([this] { watch(); });
  }
  ~StopWatcher() {
    const uint64_t one = 1;
    ssize_t ignored = write(done_fd_, &one, sizeof one);
    (void)ignored;
    thread_.join();
    close(signal_fd_);
    close(done_fd_);
  }
  StopWatcher(const StopWatcher&) = delete;
  StopWatcher& operator=(const StopWatcher&) = delete;

  // The signal received, or 0.
  int requested() const { return signal_.load(); }
  // What the main thread is doing, for the message when it is cut short.
  void at(const char* phase, int step = 0) {
    step_.store(step);
    phase_.store(phase);
  }

 private:
  // Waits for a signal or the end; returns the signal, 0 at the end or the
  // timeout.
  int next(int timeout_ms) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {done_fd_, POLLIN, 0}};
    while (true) {
      int ready = poll(fds, 2, timeout_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0 || (fds[1].revents & POLLIN)) return 0;
      signalfd_siginfo info;
      if (read(signal_fd_, &info, sizeof info) == sizeof info) return static_cast<int>(info.ssi_signo);
    }
  }

  void watch() {
    const int sig = next(-1);
    if (sig == 0) return;
    signal_.store(sig);
    // Past the grace, or a second signal: the main thread is stuck.
    pollfd done = {done_fd_, POLLIN, 0};
    if (next(kGraceMs) == 0 && poll(&done, 1, 0) == 1) return;
    const int step = step_.load();
    std::fprintf(stderr, "trainer: stopped by SIG%s while blocked in %s%s; not waiting for it to time out\n",
                 sigabbrev_np(sig), phase_.load(), step ? (" at step " + std::to_string(step)).c_str() : "");
    _exit(128 + sig);
  }

  int signal_fd_ = -1;
  int done_fd_ = -1;
  std::atomic<int> signal_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::atomic<int> step_{0};
  std::thread thread_;
};

constexpr int kHidden = 32;

// A counter-based generator: sample i's values do not depend on which rank
// draws them.
double uniform(uint64_t key) {
  key += 0x9e3779b97f4a7c15ull;
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
  key ^= key >> 31;
  return static_cast<double>(key >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

struct Sample {
  float x[kInputs];
  float y;
};

Sample sample(uint64_t index) {
  Sample s{};
  double y = 0.3;
  for (int j = 0; j < kInputs; ++j) {
    s.x[j] = static_cast<float>(uniform(index * 1000 + j));
    y += std::sin(0.5 * (j + 1)) * s.x[j];  // the function to learn
  }
  s.y = static_cast<float>(y + 0.1 * std::tanh(s.x[0] * s.x[1]));
  return s;
}

struct Model {
  bool mlp;
  std::vector<float> params;

  explicit Model(bool two_layer) : mlp(two_layer) {
    params.assign(two_layer ? kInputs * kHidden + kHidden + kHidden + 1 : kInputs + 1, 0.0f);
  }
  void init(uint64_t seed) {
    const float s = mlp ? 0.25f : 0.1f;
    for (size_t i = 0; i < params.size(); ++i) params[i] = s * static_cast<float>(uniform(seed + i));
  }

  // Adds d(loss)/d(params) of one sample (squared error) to grad, scaled by
  // `weight`, and returns the sample's loss.
  double accumulate(const Sample& s, std::vector<float>& grad, float weight) const {
    if (!mlp) {
      float pred = params[kInputs];
      for (int j = 0; j < kInputs; ++j) pred += params[j] * s.x[j];
      const float err = pred - s.y;
      for (int j = 0; j < kInputs; ++j) grad[j] += weight * 2 * err * s.x[j];
      grad[kInputs] += weight * 2 * err;
      return double(err) * err;
    }
    const float* w1 = params.data();
    const float* b1 = w1 + kInputs * kHidden;
    const float* w2 = b1 + kHidden;
    const float b2 = w2[kHidden];
    float h[kHidden];
    float pred = b2;
    for (int k = 0; k < kHidden; ++k) {
      float a = b1[k];
      for (int j = 0; j < kInputs; ++j) a += w1[k * kInputs + j] * s.x[j];
      h[k] = std::tanh(a);
      pred += w2[k] * h[k];
    }
    const float err = pred - s.y;
    float* gw1 = grad.data();
    float* gb1 = gw1 + kInputs * kHidden;
    float* gw2 = gb1 + kHidden;
    gw2[kHidden] += weight * 2 * err;
    for (int k = 0; k < kHidden; ++k) {
      gw2[k] += weight * 2 * err * h[k];
      const float dh = weight * 2 * err * w2[k] * (1 - h[k] * h[k]);
      gb1[k] += dh;
      for (int j = 0; j < kInputs; ++j) gw1[k * kInputs + j] += dh * s.x[j];
    }
    return double(err) * err;
  }
};


// --elastic: one all_reduce of [gradient..., loss] per step, summed. Rank r
// of n takes samples r, r + n, ... of the step's global batch; each sample
// weighs 1 / global batch, so the sum is the batch's mean whatever n is.
struct ElasticRun {
  int steps, print_every, global_batch;
  float lr;
  int fail_rank = -1, fail_step = 0;      // --fail-rank R --fail-step K
  int shrink_rank = -1, shrink_step = 0;  // --shrink-rank R --shrink-step K
};

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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

double elastic_step(comms::Comm& comm, const Model& model, std::vector<float>& buf, int step,
                    const ElasticRun& run) {
  std::fill(buf.begin(), buf.end(), 0.0f);
  const float weight = 1.0f / static_cast<float>(run.global_batch);
  double local_loss = 0;
  for (int i = comm.rank(); i < run.global_batch; i += comm.size()) {
    const double l = model.accumulate(sample(uint64_t(step) * run.global_batch + i), buf, weight);
    local_loss += l / run.global_batch;
  }
  buf.back() = static_cast<float>(local_loss);
  return local_loss;
}

int train_elastic(comms::dist::Group& world, const ElasticRun& run, Model& model, StopWatcher& stop) {
  std::shared_ptr<comms::Comm> comm = world.shared_comm();
  const int global_rank = world.rank();
  if (comm->rank() == 0) model.init(42);
  comm->broadcast(comms::BufferView::of(model.params), 0);
  std::vector<float> buf(model.params.size() + 1);
  SelfKiller killer;
  double loss = 0;
  bool recovered = false;
  for (int step = 1; step <= run.steps; ++step) {
    if (step == run.shrink_step && run.shrink_rank >= 0 && run.shrink_rank < comm->size()) {
      stop.at("a planned shrink", step);
      const int excluded[] = {run.shrink_rank};
      auto smaller = comms::shrink(*comm, excluded);
      if (!smaller) {
        std::printf("trainer: rank %d left by a planned shrink before step %d\n", global_rank, step);
        comm.reset();
        comms::dist::destroy_process_group();
        return 0;
      }
      comm = std::move(smaller);
      if (comm->rank() == 0) std::printf("shrunk: excluded rank %d before step %d, world %d\n", run.shrink_rank, step, comm->size());
    }
    stop.at("the gradient all_reduce", step);
    elastic_step(*comm, model, buf, step, run);
    const bool dying = step == run.fail_step && global_rank == run.fail_rank;
    if (dying) killer.arm();
    bool ok = true;
    try {
      if (dying) killer.fire();
      comm->all_reduce(comms::BufferView::of(buf), comms::ReduceOp::sum());
    } catch (const comms::Error& e) {
      if (e.code() == comms::ErrorCode::kInvalidArgument || e.code() == comms::ErrorCode::kUnsupported) throw;
      std::fprintf(stderr, "trainer: step %d failed, recovering: %s\n", step, e.what());
      ok = false;
    }
    if (dying) killer.wait_for_death();
    stop.at("the step's commit vote", step);
    if (!comms::agree_all(*comm, ok)) {
      stop.at("recovery (revoke, agree, shrink)", step);
      comms::Recovery r = comms::recover(*comm);
      comm = r.comm;
      if (comm->rank() == 0) {
        std::string lost;
        for (int l : r.agreement.lost) lost += (lost.empty() ? "" : ",") + std::to_string(l);
        std::printf("recovered: lost ranks [%s] in %lld ms, world %d\n", lost.c_str(),
                    static_cast<long long>(r.took.count()), comm->size());
        std::fflush(stdout);
      }
      recovered = true;
      --step;  // redo it on the survivors
      continue;
    }
    if (recovered && comm->rank() == 0) {
      std::printf("first step after recovery done (t=%.6f)\n", unix_seconds());
      recovered = false;
    }
    loss = buf.back();
    for (size_t p = 0; p < model.params.size(); ++p) model.params[p] -= run.lr * buf[p];
    if (comm->rank() == 0 && (step % run.print_every == 0 || step == 1)) {
      std::printf("step %d loss %.9g\n", step, loss);
      std::fflush(stdout);
    }
    if (const int sig = stop.requested()) {
      std::fprintf(stderr, "trainer: stopped by SIG%s at step %d\n", sigabbrev_np(sig), step);
      return 128 + sig;
    }
  }
  stop.at("the final barrier and shutdown", run.steps);
  comm->barrier();
  if (comm->rank() == 0) std::printf("final_loss=%.9g world=%d\n", loss, comm->size());
  comm.reset();
  comms::dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel trainer on comms (backend from COMMS_BACKEND)"};
  int steps = 200;
  int print_every = 20;
  int global_batch = 48;
  float lr = 0.05f;
  std::string model_kind = "linear";
  int offload_every = 0;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--print-every", print_every, "print the loss every K steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", global_batch, "global batch size (split across ranks)")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate");
  app.add_option("--model", model_kind, "linear or mlp")->check(CLI::IsMember({"linear", "mlp"}));
  app.add_option("--offload-every", offload_every,
                 "every K steps, offload and reload the groups' communicators (as an RL loop does "
                 "between phases): the device backends, or cpu on a CPU-only run");
  std::string parallel_text;
  std::string comm_config_path;
  app.add_option("--parallel", parallel_text,
                 "tp=..,pp=..,cp=..,ep=..,etp=..,dp=..,order=..: build a model-parallel collection and average "
                 "gradients over its dp group (tp/pp/cp peers hold replicas of this tiny model)");
  app.add_option("--nccl-communicator-config-path", comm_config_path,
                 "per-group communicator options, Megatron's YAML layout (with --parallel)");
  bool elastic = false;
  ElasticRun erun{};
  app.add_flag("--elastic", elastic,
               "survive a lost rank: recover (revoke, agree, shrink) and redo the step on the survivors");
  app.add_option("--fail-rank", erun.fail_rank, "with --elastic: this rank SIGKILLs itself inside --fail-step's all_reduce");
  app.add_option("--fail-step", erun.fail_step, "the step --fail-rank dies in");
  app.add_option("--shrink-rank", erun.shrink_rank, "with --elastic: a planned shrink removes this rank (of the comm in force)");
  app.add_option("--shrink-step", erun.shrink_step, "just before this step");
  CLI11_PARSE(app, argc, argv);
  if (!elastic && (erun.fail_rank >= 0 || erun.shrink_rank >= 0)) {
    std::fprintf(stderr, "trainer: --fail-rank and --shrink-rank need --elastic\n");
    return 2;
  }
  if (elastic && (!parallel_text.empty() || offload_every > 0)) {
    std::fprintf(stderr, "trainer: --elastic trains data-parallel over the world: no --parallel or --offload-every\n");
    return 2;
  }

  StopWatcher stop;
  try {
    stop.at("initialisation (init_process_group and group creation)");
    // Binding the CPU device connects the world eagerly, so a bad backend or
    // a missing peer shows up here, not at the first gradient. It also lets
    // COMMS_ROUTE=split carve groups from the world.
    comms::dist::InitOptions init;
    init.device = comms::Device::cpu();
    if (elastic) init.elastic = true;
    comms::dist::Group world = comms::dist::init_process_group(init);
    if (elastic) {
      erun.steps = steps;
      erun.print_every = print_every;
      erun.global_batch = global_batch;
      erun.lr = lr;
      if (world.rank() == 0) {
        std::printf("trainer: %d ranks (elastic data parallel), backend %s, model %s, global batch %d\n",
                    world.size(), world.backend().c_str(), model_kind.c_str(), global_batch);
      }
      Model model(model_kind == "mlp");
      return train_elastic(world, erun, model, stop);
    }
    const int rank = world.rank();
    const int size = world.size();
    // Gradients are averaged over the data-parallel group: the whole world,
    // or the dp group of a model-parallel collection. Each dp rank takes its
    // slice of the global batch, so the loss matches the pure data-parallel
    // run with as many ranks as dp.
    comms::dist::Group grads;
    std::optional<comms::dist::ProcessGroupCollection> collection;
    std::string layout = "data parallel";
    if (!parallel_text.empty()) {
      const comms::dist::ParallelFlags flags = comms::dist::parse_parallel_flags(parallel_text);
      if (flags.world && *flags.world != size) {
        throw comms::Error(comms::ErrorCode::kInvalidArgument,
                           "--parallel world=" + std::to_string(*flags.world) + " but the job has " +
                               std::to_string(size) + " ranks");
      }
      if (flags.config.rank_offset != 0) {
        throw comms::Error(comms::ErrorCode::kInvalidArgument,
                           "--parallel rank_offset must be 0 here: every rank of the job trains");
      }
      comms::dist::ParallelConfig config = flags.config;
      config.name = "trainer";
      if (!comm_config_path.empty()) config.group_options = comms::dist::load_communicator_config(comm_config_path);
      const int derived_dp = comms::dist::plan_model_parallel(config, size).dp;
      if (flags.dp && *flags.dp != derived_dp) {
        throw comms::Error(comms::ErrorCode::kInvalidArgument,
                           "--parallel dp=" + std::to_string(*flags.dp) + " but " + std::to_string(size) +
                               " ranks / (tp*pp*cp) give dp=" + std::to_string(derived_dp));
      }
      collection = comms::dist::initialize_model_parallel(config);
      grads = collection->dp();
      layout = "tp=" + std::to_string(config.tp) + " pp=" + std::to_string(config.pp) + " cp=" +
               std::to_string(config.cp) + " dp=" + std::to_string(collection->plan().dp) + " order " + config.order;
    } else {
      if (!comm_config_path.empty()) {
        std::fprintf(stderr, "trainer: --nccl-communicator-config-path needs --parallel\n");
        return 2;
      }
      comms::dist::GroupOptions dp_options;
      dp_options.description = "data-parallel gradient averaging";
      grads = comms::dist::new_group(world.global_ranks(), dp_options);  // every rank
    }
    const int dp_rank = grads.rank();
    const int dp_size = grads.size();
    if (global_batch % dp_size != 0) {
      std::fprintf(stderr, "trainer: the global batch %d does not split evenly over %d data-parallel ranks\n",
                   global_batch, dp_size);
      return 2;
    }
    const int local_batch = global_batch / dp_size;
    if (rank == 0) {
      std::printf("trainer: %d ranks (%s), backend %s, route %s, model %s, global batch %d\n", size,
                  layout.c_str(), world.backend().c_str(),
                  std::string(comms::dist::to_string(grads.route())).c_str(), model_kind.c_str(), global_batch);
    }

    Model model(model_kind == "mlp");
    if (rank == 0) model.init(42);  // the others receive rank 0's parameters
    world->broadcast(comms::BufferView::of(model.params), 0);

    std::vector<float> grad(model.params.size());
    double loss = 0;
    for (int step = 1; step <= steps; ++step) {
      stop.at("the gradient all_reduce", step);
      std::fill(grad.begin(), grad.end(), 0.0f);
      double local_loss = 0;
      const float weight = 1.0f / static_cast<float>(local_batch);
      for (int i = 0; i < local_batch; ++i) {
        const uint64_t index = uint64_t(step) * global_batch + uint64_t(dp_rank) * local_batch + i;
        local_loss += model.accumulate(sample(index), grad, weight);
      }
      local_loss /= local_batch;
      grads->all_reduce(comms::BufferView::of(grad), comms::ReduceOp::avg());
      grads->all_reduce(comms::BufferView::of(&local_loss, 1), comms::ReduceOp::avg());
      loss = local_loss;
      for (size_t p = 0; p < model.params.size(); ++p) model.params[p] -= lr * grad[p];
      if (rank == 0 && (step % print_every == 0 || step == 1)) {
        std::printf("step %d loss %.9g\n", step, loss);
        std::fflush(stdout);
      }
      if (offload_every > 0 && step % offload_every == 0) {
        // Device backends are what an RL loop frees; a CPU-only run cycles
        // its Gloo communicators instead, through the same path.
        stop.at("offload/reload of the groups", step);
        std::vector<comms::DeviceType> types;
        if (!world->backends().has(comms::DeviceType::kCuda)) types.push_back(comms::DeviceType::kCpu);
        const comms::dist::OffloadReport offloaded = comms::dist::offload_groups(types);
        const comms::dist::ReloadReport reloaded = comms::dist::reload_groups();
        if (rank == 0) {
          std::printf("%s reloaded_groups=%d reloaded_communicators=%d\n", offloaded.to_string().c_str(),
                      reloaded.groups_reloaded, reloaded.communicators_created);
        }
      }
      if (const int sig = stop.requested()) {
        std::fprintf(stderr, "trainer: stopped by SIG%s at step %d\n", sigabbrev_np(sig), step);
        return 128 + sig;
      }
    }
    stop.at("the final barrier and shutdown");
    world->barrier();
    if (rank == 0) std::printf("final_loss=%.9g\n", loss);
    comms::dist::destroy_process_group();
    return 0;
  } catch (const comms::Error& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // a bug, but report it rather than abort
    std::fprintf(stderr, "trainer: unexpected error: %s\n", e.what());
    return 1;
  }
}
