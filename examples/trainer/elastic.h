// The trainer's --elastic loop: survives lost ranks (recover and redo the
// step on the survivors) and heals (admits newcomers at step boundaries and
// sends them the model). elastic.cc says how.
#pragma once

#include <memory>

#include "comms/comms.h"
#include "trainer.h"

namespace trainer {

struct ElasticRun {
  int steps, print_every, global_batch;
  float lr;
  int fail_rank = -1, fail_step = 0;      // --fail-rank R --fail-step K
  int shrink_rank = -1, shrink_step = 0;  // --shrink-rank R --shrink-step K
  int grow_step = 0;                      // --grow-step K: admit only there, waiting for a newcomer
};

// A rank of the job: trains from step 1 on `comm` (the world; `world_rank`
// its rank there), admitting newcomers at step boundaries. Returns the
// process's exit code.
int train_elastic(std::shared_ptr<comms::Comm> comm, int world_rank, const ElasticRun& run, Model& model,
                  StopWatcher& stop);

// A newcomer (commsrun --replace started it: COMMS_REPLACEMENT is set): joins
// the job's comm, receives the model and the step, and trains on.
int join_and_train(const ElasticRun& run, Model& model, StopWatcher& stop);

}  // namespace trainer
