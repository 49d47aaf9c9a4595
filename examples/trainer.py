#!/usr/bin/env python3
"""The data-parallel trainer of examples/trainer/trainer.cc, in Python with numpy.

Same model, data, steps and output: a linear or two-layer model fit to
deterministic synthetic data; each step uses the same global batch whatever
the world size, every rank takes a contiguous slice of it, gradients are
averaged with all_reduce(avg) and the parameters start from rank 0's by
broadcast. The arithmetic follows the C++ program operation by operation in
float32 (loss in float64), so final_loss= agrees with it.

    PYTHONPATH=build/python build/tools/commsrun -n 4 -- python3 examples/trainer.py --steps 100

The backend comes from COMMS_BACKEND (default: Gloo on CPU) and the route that
creates groups from COMMS_ROUTE (direct or split).

--elastic survives a lost rank as the C++ trainer does (comms.recover, a
per-step commit vote with comms.agree_all, the step redone on the survivors);
--fail-rank/--fail-step and --shrink-rank/--shrink-step end with the same
final_loss (each other's, not the C++ trainer's: numpy sums the batch in another order).
It heals as the C++ trainer does too: the members call comms.admit at every
step boundary and rank 0 broadcasts the step and the parameters over the
grown comm; a process started with COMMS_REPLACEMENT (commsrun --keep-going
--replace) calls comms.join("world") instead of creating the world, receives
them, and trains on. --grow-step G admits only before step G, waiting there.
"""
import argparse
import os
import signal
import sys
import threading
import time

import numpy as np

import comms
from comms import dist, parallel

INPUTS = 16
HIDDEN = 32
F32 = np.float32


def uniform(keys):
    """The counter-based generator (splitmix64): sample i's values do not
    depend on which rank draws them. keys: uint64 array; result float64 in [-1, 1)."""
    k = keys + np.uint64(0x9E3779B97F4A7C15)
    k = (k ^ (k >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    k = (k ^ (k >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    k ^= k >> np.uint64(31)
    return (k >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0) * 2.0 - 1.0


def samples(indices):
    """x (n, INPUTS) float32 and y (n,) float32 of the given sample indices."""
    idx = np.asarray(indices, np.uint64)
    keys = idx[:, None] * np.uint64(1000) + np.arange(INPUTS, dtype=np.uint64)[None, :]
    x = uniform(keys).astype(F32)
    y = np.full(len(idx), 0.3)
    for j in range(INPUTS):  # the function to learn, summed in the C++ order
        y += np.sin(0.5 * (j + 1)) * x[:, j].astype(np.float64)
    y = (y + 0.1 * np.tanh(x[:, 0] * x[:, 1]).astype(np.float64)).astype(F32)
    return x, y


class Model:
    def __init__(self, mlp):
        self.mlp = mlp
        size = INPUTS * HIDDEN + HIDDEN + HIDDEN + 1 if mlp else INPUTS + 1
        self.params = np.zeros(size, F32)

    def init(self, seed):
        scale = F32(0.25 if self.mlp else 0.1)
        self.params[:] = scale * uniform(np.uint64(seed) + np.arange(self.params.size, dtype=np.uint64)).astype(F32)

    def accumulate(self, x, y, grad, weight):
        """Adds d(loss)/d(params) of each sample (squared error), scaled by
        weight, to grad in sample order; returns the samples' float64 losses."""
        return self._mlp(x, y, grad, weight) if self.mlp else self._linear(x, y, grad, weight)

    def _linear(self, x, y, grad, weight):
        p = self.params
        pred = np.full(len(y), p[INPUTS], F32)
        for j in range(INPUTS):
            pred += p[j] * x[:, j]
        err = pred - y
        scaled = weight * F32(2) * err
        for i in range(len(y)):
            grad[:INPUTS] += scaled[i] * x[i]
            grad[INPUTS] += scaled[i]
        return err.astype(np.float64) * err

    def _mlp(self, x, y, grad, weight):
        p = self.params
        w1 = p[:INPUTS * HIDDEN].reshape(HIDDEN, INPUTS)
        b1 = p[INPUTS * HIDDEN:INPUTS * HIDDEN + HIDDEN]
        w2 = p[INPUTS * HIDDEN + HIDDEN:INPUTS * HIDDEN + 2 * HIDDEN]
        b2 = p[-1]
        a = np.repeat(b1[None, :], len(y), axis=0)
        for j in range(INPUTS):
            a += w1[:, j][None, :] * x[:, j][:, None]
        h = np.tanh(a)
        pred = np.full(len(y), b2, F32)
        for k in range(HIDDEN):
            pred += w2[k] * h[:, k]
        err = pred - y
        gw1 = grad[:INPUTS * HIDDEN].reshape(HIDDEN, INPUTS)
        gb1 = grad[INPUTS * HIDDEN:INPUTS * HIDDEN + HIDDEN]
        gw2 = grad[INPUTS * HIDDEN + HIDDEN:INPUTS * HIDDEN + 2 * HIDDEN]
        for i in range(len(y)):
            scaled = weight * F32(2) * err[i]
            grad[-1] += scaled
            gw2 += scaled * h[i]
            dh = scaled * w2 * (F32(1) - h[i] * h[i])
            gb1 += dh
            gw1 += dh[:, None] * x[i][None, :]
        return err.astype(np.float64) * err


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Data-parallel trainer on comms (backend from COMMS_BACKEND)")
    ap.add_argument("--steps", type=int, default=200, help="training steps")
    ap.add_argument("--print-every", type=int, default=20, help="print the loss every K steps")
    ap.add_argument("--batch", type=int, default=48, help="global batch size (split across ranks)")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate")
    ap.add_argument("--model", choices=["linear", "mlp"], default="linear")
    ap.add_argument("--offload-every", type=int, default=0,
                    help="every K steps, offload and reload the groups' communicators")
    ap.add_argument("--parallel", default="", help="tp=..,pp=..,cp=..,dp=..,order=..: average over the dp group")
    ap.add_argument("--nccl-communicator-config-path", default="",
                    help="per-group communicator options, Megatron's YAML layout (with --parallel)")
    ap.add_argument("--elastic", action="store_true",
                    help="survive a lost rank: recover (revoke, agree, shrink) and redo the step on the survivors")
    ap.add_argument("--fail-rank", type=int, default=-1, help="with --elastic: this rank SIGKILLs itself")
    ap.add_argument("--fail-step", type=int, default=0, help="inside this step's all_reduce")
    ap.add_argument("--shrink-rank", type=int, default=-1, help="with --elastic: a planned shrink removes this rank")
    ap.add_argument("--shrink-step", type=int, default=0, help="just before this step")
    ap.add_argument("--grow-step", type=int, default=0,
                    help="with --elastic: admit newcomers only before this step, waiting there (up to 60 s) for one")
    args = ap.parse_args(argv)
    if not args.elastic and (args.fail_rank >= 0 or args.shrink_rank >= 0 or args.grow_step > 0):
        ap.error("--fail-rank, --shrink-rank and --grow-step need --elastic")
    if args.elastic and (args.parallel or args.offload_every):
        ap.error("--elastic trains data-parallel over the world: no --parallel or --offload-every")
    for name in ("steps", "print_every", "batch"):
        if getattr(args, name) <= 0:
            ap.error("--%s must be positive" % name.replace("_", "-"))
    return args


class UsageError(Exception):
    """A --parallel layout that does not fit the job (reported like comms.Error)."""


def gradient_group(args, world):
    """The group gradients are averaged over, and the layout's description."""
    size = world.size
    if not args.parallel:
        if args.nccl_communicator_config_path:
            print("trainer: --nccl-communicator-config-path needs --parallel", file=sys.stderr)
            raise SystemExit(2)
        return dist.new_group(world.global_ranks, description="data-parallel gradient averaging"), "data parallel"
    config, flag_world, flag_dp = parallel.parse_parallel_flags(args.parallel)
    if flag_world is not None and flag_world != size:
        raise UsageError("--parallel world=%d but the job has %d ranks" % (flag_world, size))
    if config.rank_offset != 0:
        raise UsageError("--parallel rank_offset must be 0 here: every rank of the job trains")
    config.name = "trainer"
    if args.nccl_communicator_config_path:
        with open(args.nccl_communicator_config_path) as f:
            config.set_communicator_config(f.read())
    derived_dp = parallel.plan_model_parallel(config, size)["dp"]
    if flag_dp is not None and flag_dp != derived_dp:
        raise UsageError("--parallel dp=%d but %d ranks / (tp*pp*cp) give dp=%d" % (flag_dp, size, derived_dp))
    collection = parallel.initialize_model_parallel(config)
    layout = "tp=%d pp=%d cp=%d dp=%d order %s" % (config.tp, config.pp, config.cp, collection.dp_size, config.order)
    return collection.dp, layout


def train(args):
    if args.elastic and os.environ.get("COMMS_REPLACEMENT"):
        return join_and_train(args)
    # device="cpu" binds eagerly: a missing peer shows up here.
    world = dist.init_process_group(device="cpu", elastic=True if args.elastic else None)
    if args.elastic:
        if world.rank == 0:
            print("trainer: %d ranks (elastic data parallel), backend %s, model %s, global batch %d"
                  % (world.size, world.backend, args.model, args.batch))
        return train_elastic(args, world)
    rank, size = world.rank, world.size
    grads, layout = gradient_group(args, world)
    dp_rank, dp_size = grads.rank, grads.size
    if args.batch % dp_size != 0:
        print("trainer: the global batch %d does not split evenly over %d data-parallel ranks"
              % (args.batch, dp_size), file=sys.stderr)
        return 2
    local_batch = args.batch // dp_size
    if rank == 0:
        print("trainer: %d ranks (%s), backend %s, route %s, model %s, global batch %d"
              % (size, layout, world.backend, grads.route, args.model, args.batch))

    model = Model(args.model == "mlp")
    if rank == 0:
        model.init(42)  # the others receive rank 0's parameters
    world.broadcast(model.params, root=0)

    grad = np.zeros_like(model.params)
    weight = F32(1.0) / F32(local_batch)
    lr = F32(args.lr)
    loss = 0.0
    for step in range(1, args.steps + 1):
        grad[:] = 0
        first = step * args.batch + dp_rank * local_batch
        x, y = samples(np.arange(first, first + local_batch))
        local_loss = 0.0
        for sample_loss in model.accumulate(x, y, grad, weight):
            local_loss += float(sample_loss)
        local_loss /= local_batch
        grads.all_reduce(grad, op="avg")
        loss_buf = np.array([local_loss], np.float64)
        grads.all_reduce(loss_buf, op="avg")
        loss = float(loss_buf[0])
        model.params -= lr * grad
        if rank == 0 and (step % args.print_every == 0 or step == 1):
            print("step %d loss %.9g" % (step, loss), flush=True)
        if args.offload_every > 0 and step % args.offload_every == 0:
            types = ["cpu"] if world.comm.backend_state("cuda") == "absent" else None
            offloaded = dist.offload_groups(types)
            reloaded = dist.reload_groups()
            if rank == 0:
                print("%s reloaded_groups=%d reloaded_communicators=%d"
                      % (offloaded["text"], reloaded["groups_reloaded"], reloaded["communicators_created"] + reloaded["communicators_resumed"]))
    world.barrier()
    if rank == 0:
        print("final_loss=%.9g" % loss, flush=True)
    dist.destroy_process_group()
    return 0


def elastic_step(comm, model, buf, step, batch):
    """[gradient..., loss] of this rank's samples: rank r of n takes r, r + n, ..."""
    buf[:] = 0
    idx = np.arange(step * batch + comm.rank, (step + 1) * batch, comm.size)
    x, y = samples(idx)
    local_loss = 0.0
    for sample_loss in model.accumulate(x, y, buf[:-1], F32(1.0) / F32(batch)):
        local_loss += float(sample_loss) / batch
    buf[-1] = F32(local_loss)


def kill_inside_all_reduce():
    """Arms a thread that SIGKILLs this process once the event is set."""
    go = threading.Event()

    def run():
        go.wait()
        print("trainer: killing this rank inside the all_reduce (t=%.6f)" % time.time(), file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=run, daemon=True).start()
    return go


PLANNED_GROW_WAIT_S = 60  # --grow-step: how long the members wait for a newcomer
PLANNED_GROW_POLL_S = 0.02


class ElasticLoop:
    """train_elastic of examples/trainer/elastic.cc: recovers from lost ranks
    and admits newcomers at step boundaries."""

    def __init__(self, comm, global_rank, args, model):
        self.comm, self.global_rank, self.args, self.model = comm, global_rank, args, model
        self.recovered = self.shrink_done = self.grow_done = False

    def adopt(self, comm):
        self.comm = comm
        dist.destroy_process_group()  # the world group held the first comm, replaced now

    def recover(self):
        r = comms.recover(self.comm)
        self.adopt(r["comm"])
        if self.comm.rank == 0:
            print("recovered: lost ranks [%s] in %d ms, world %d"
                  % (",".join(map(str, r["lost"])), r["took_ms"], self.comm.size), flush=True)
        self.recovered = True

    def share_state(self, step):
        """Rank 0's step and parameters to every rank (newcomers take them);
        again on the survivors when a rank is lost meanwhile. Returns the step
        and when the first broadcast completed (a newcomer's first collective)."""
        first_done = None
        while True:
            header = np.array([step], np.int64)
            ok = True
            try:
                self.comm.broadcast(header, root=0)
                first_done = time.monotonic()
                self.comm.broadcast(self.model.params, root=0)
            except comms.Error as e:
                if e.code in ("invalid_argument", "unsupported"):
                    raise
                print("trainer: sending the model before step %d failed, recovering: %s" % (step, e), file=sys.stderr)
                ok = False
            if comms.agree_all(self.comm, ok):
                return int(header[0]), first_done
            self.recover()

    def planned_shrink(self, step):
        """False when this rank is the one excluded."""
        args = self.args
        if self.shrink_done or step != args.shrink_step or not 0 <= args.shrink_rank < self.comm.size:
            return True
        self.shrink_done = True
        smaller = comms.shrink(self.comm, exclude=[args.shrink_rank])
        if smaller is None:
            print("trainer: rank %d left by a planned shrink before step %d" % (self.global_rank, step))
            return False
        self.adopt(smaller)
        if self.comm.rank == 0:
            print("shrunk: excluded rank %d before step %d, world %d" % (args.shrink_rank, step, self.comm.size))
        return True

    def admit_newcomers(self, step):
        """False when the admission failed and the comm was recovered instead."""
        planned = self.args.grow_step > 0
        if planned and (self.grow_done or step != self.args.grow_step):
            return True
        waiting_since = time.monotonic()
        while True:
            admitting_since = time.monotonic()
            try:
                grown = comms.admit(self.comm)
            except comms.Error as e:
                if e.code in ("invalid_argument", "unsupported"):
                    raise
                print("trainer: the admission before step %d failed, recovering: %s" % (step, e), file=sys.stderr)
                self.recover()
                return False
            if not planned or grown is not self.comm:
                break
            if time.monotonic() - waiting_since > PLANNED_GROW_WAIT_S:
                e = comms.Error("--grow-step %d: no newcomer joined %s within %d s (rank %d)"
                                % (step, self.comm.name, PLANNED_GROW_WAIT_S, self.comm.rank))
                e.code = "timeout"
                raise e
            time.sleep(PLANNED_GROW_POLL_S)
        if grown is self.comm:
            return True
        self.grow_done = planned
        before = self.comm.size
        self.adopt(grown)
        sending_since = time.monotonic()
        self.share_state(step)
        if self.comm.rank == 0:
            print("grown: ranks [%s] joined in %.1f ms at step %d, world %d (state transfer %.1f ms)"
                  % (",".join(map(str, range(before, self.comm.size))), (time.monotonic() - admitting_since) * 1e3,
                     step, self.comm.size, (time.monotonic() - sending_since) * 1e3), flush=True)
        return True

    def train(self, step, admitted):
        """Steps `step`..steps; admitted: this process was admitted at step's boundary."""
        args, model = self.args, self.model
        admitted_at_the_end = admitted and step > args.steps
        buf = np.zeros(model.params.size + 1, F32)
        lr = F32(args.lr)
        loss, boundary_passed = 0.0, admitted
        while step <= args.steps:
            if not boundary_passed:
                if not self.planned_shrink(step):
                    self.comm = None
                    dist.destroy_process_group()
                    return 0
                if not self.admit_newcomers(step):
                    continue  # the boundary again, on the survivors
            boundary_passed = False
            comm = self.comm
            elastic_step(comm, model, buf, step, args.batch)
            dying = step == args.fail_step and self.global_rank >= 0 and self.global_rank == args.fail_rank
            ok = True
            try:
                if dying:
                    kill_inside_all_reduce().set()
                comm.all_reduce(buf, op="sum")
            except comms.Error as e:
                if e.code in ("invalid_argument", "unsupported"):
                    raise
                ok = False
            while dying:  # never past the step: its vote would count it in
                time.sleep(1)
            if not comms.agree_all(comm, ok):
                self.recover()
                continue  # redo the step on the survivors
            if self.recovered and comm.rank == 0:
                print("first step after recovery done (t=%.6f)" % time.time())
                self.recovered = False
            loss = float(buf[-1])
            model.params -= lr * buf[:-1]
            if comm.rank == 0 and (step % args.print_every == 0 or step == 1):
                print("step %d loss %.9g world %d" % (step, loss, comm.size), flush=True)
            step += 1
        # A newcomer waiting now ends with the job (its step is past the
        # last) instead of waiting in join for its timeout (not one admitted
        # there: the others have passed it); one that comes later is told
        # the job has finished.
        if args.grow_step == 0 and not admitted_at_the_end:
            self.admit_newcomers(args.steps + 1)
        if self.comm.rank == 0:
            comms.close_admissions(self.comm)
        self.comm.barrier()
        if self.comm.rank == 0:
            print("final_loss=%.9g world=%d" % (loss, self.comm.size), flush=True)
        self.comm = None
        dist.destroy_process_group()
        return 0


def train_elastic(args, world):
    model = Model(args.model == "mlp")
    if world.comm.rank == 0:
        model.init(42)
    world.comm.broadcast(model.params, root=0)
    return ElasticLoop(world.comm, world.rank, args, model).train(1, False)


def join_and_train(args):
    """A newcomer: joins the job's world comm, receives the model and the step."""
    joining_since = time.monotonic()
    # "world": the name comms.dist gives the world comm. An admission that
    # fails on the members' side makes join take a new ticket.
    try:
        comm = comms.join("world")
    except comms.Error as e:
        if e.code != "aborted":
            raise
        print("trainer: the job finished before admitting this process: %s" % e, flush=True)
        return 0
    joined = time.monotonic()
    loop = ElasticLoop(comm, -1, args, Model(args.model == "mlp"))
    step, first_collective = loop.share_state(0)
    print("trainer: joined as rank %d of %d before step %d: first collective %.1f ms after calling join "
          "(join returned at %.1f ms), state transfer %.1f ms"
          % (loop.comm.rank, loop.comm.size, step, (first_collective - joining_since) * 1e3,
             (joined - joining_since) * 1e3, (time.monotonic() - joined) * 1e3), flush=True)
    return loop.train(step, True)


def main(argv=None):
    args = parse_args(argv)
    try:
        return train(args)
    except (comms.Error, UsageError) as e:
        print("trainer: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
