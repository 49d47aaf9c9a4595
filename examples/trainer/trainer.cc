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
// With --elastic it survives lost ranks and heals: a failed step is redone
// on the survivors after comms::recover(), and newcomers (replacements that
// commsrun --replace starts) are admitted at step boundaries and sent the
// model. elastic.cc has that loop.
//
// The backend comes from COMMS_BACKEND (default: Gloo on CPU) and the route
// that creates groups from COMMS_ROUTE (direct or split), so switching either
// needs no code change.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "comms/comms.h"
#include "comms/env.h"
#include "elastic.h"
#include "trainer.h"

using namespace trainer;

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
               "survive a lost rank: recover (revoke, agree, shrink) and redo the step on the survivors; "
               "admit newcomers at every step boundary (a process started with COMMS_REPLACEMENT, as "
               "commsrun --keep-going --replace does, joins the job and receives the model)");
  app.add_option("--fail-rank", erun.fail_rank, "with --elastic: this rank SIGKILLs itself inside --fail-step's all_reduce");
  app.add_option("--fail-step", erun.fail_step, "the step --fail-rank dies in");
  app.add_option("--shrink-rank", erun.shrink_rank, "with --elastic: a planned shrink removes this rank (of the comm in force)");
  app.add_option("--shrink-step", erun.shrink_step, "just before this step");
  app.add_option("--grow-step", erun.grow_step,
                 "with --elastic: admit newcomers only before this step, waiting there (up to 60 s) for one")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (!elastic && (erun.fail_rank >= 0 || erun.shrink_rank >= 0 || erun.grow_step > 0)) {
    std::fprintf(stderr, "trainer: --fail-rank, --shrink-rank and --grow-step need --elastic\n");
    return 2;
  }
  if (elastic && (!parallel_text.empty() || offload_every > 0)) {
    std::fprintf(stderr, "trainer: --elastic trains data-parallel over the world: no --parallel or --offload-every\n");
    return 2;
  }

  StopWatcher stop;
  try {
    if (elastic) {
      erun.steps = steps;
      erun.print_every = print_every;
      erun.global_batch = global_batch;
      erun.lr = lr;
      Model model(model_kind == "mlp");
      if (comms::env::get("COMMS_REPLACEMENT")) return join_and_train(erun, model, stop);
    }
    stop.at("initialisation (init_process_group and group creation)");
    // Binding the CPU device connects the world eagerly, so a bad backend or
    // a missing peer shows up here, not at the first gradient. It also lets
    // COMMS_ROUTE=split carve groups from the world.
    comms::dist::InitOptions init;
    init.device = comms::Device::cpu();
    if (elastic) init.elastic = true;
    comms::dist::Group world = comms::dist::init_process_group(init);
    if (elastic) {
      if (world.rank() == 0) {
        std::printf("trainer: %d ranks (elastic data parallel), backend %s, model %s, global batch %d\n",
                    world.size(), world.backend().c_str(), model_kind.c_str(), global_batch);
      }
      Model model(model_kind == "mlp");
      return train_elastic(world.shared_comm(), world.rank(), erun, model, stop);
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
                      reloaded.groups_reloaded, reloaded.communicators_created + reloaded.communicators_resumed);
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
