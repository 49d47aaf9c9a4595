// P2PChannels: a two-rank comm per peer and direction, made off the caller's
// thread, whose sends and receives are issued as soon as it exists.
#include "p2p_channels.h"

#include <condition_variable>
#include <deque>

#include "process_group.h"

namespace comms_torch {

struct P2PChannels::Channel {
  struct Posted {
    comms::BufferView buffer;
    comms::OpOptions opts;
    c10::intrusive_ptr<CommsWork> work;
  };
  bool is_send = true;
  std::mutex mutex;
  std::shared_ptr<comms::Comm> comm;  // set once made
  std::exception_ptr failed;          // why it could not be made, or was aborted
  std::string aborted;                // abort()'s reason, if it came first
  std::deque<Posted> posted;          // issued before it was made
  std::thread maker;

  // The channel's peer is rank 1 - own rank of its two-rank comm.
  void issue(Posted& p) {
    try {
      const int peer = comm->rank() == 0 ? 1 : 0;
      p.work->assign(is_send ? comm->send(p.buffer, peer, p.opts) : comm->recv(p.buffer, peer, p.opts));
    } catch (...) {
      p.work->assign_error(std::current_exception());
    }
  }
};

P2PChannels::P2PChannels(c10::intrusive_ptr<c10d::Store> store, const GroupConfig& config, std::string backend,
                         int rank)
    : store_(std::move(store)),
      name_(config.name),
      backend_(std::move(backend)),
      hints_(config.hints),
      op_timeout_(config.op_timeout),
      init_timeout_(config.init_timeout),
      rank_(rank) {}

P2PChannels::~P2PChannels() {
  try {
    finalize();
  } catch (const std::exception&) {
    // the group's finalize reported it already, or nobody can
  }
}

std::shared_ptr<P2PChannels::Channel> P2PChannels::channel(bool is_send, int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = channels_[{is_send, peer}];
  if (slot) return slot;
  auto ch = std::make_shared<Channel>();
  ch->is_send = is_send;
  const int from = is_send ? rank_ : peer;
  const int to = is_send ? peer : rank_;
  comms::CommOptions options;
  options.store = std::make_shared<C10dStore>(store_);
  options.rank = is_send ? 0 : 1;  // the sender is rank 0 of channel from->to
  options.world_size = 2;
  options.hints = hints_;
  options.op_timeout = op_timeout_;
  options.init_timeout = init_timeout_;
  const std::string name = name_ + "/p2p" + std::to_string(generation_) + "/" + std::to_string(from) + "to" +
                           std::to_string(to);
  ch->maker = std::thread([ch, options, name, backend = backend_] {
    std::shared_ptr<comms::Comm> comm;
    std::exception_ptr failed;
    try {
      comm = comms::new_comm(backend, std::nullopt, name, options);
    } catch (...) {
      failed = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(ch->mutex);
    ch->comm = std::move(comm);
    if (!ch->failed) ch->failed = failed;
    if (ch->comm && !ch->aborted.empty()) ch->comm->abort(ch->aborted);
    for (auto& p : ch->posted) {
      if (ch->failed) p.work->assign_error(ch->failed);
      else ch->issue(p);
    }
    ch->posted.clear();
  });
  slot = ch;
  return ch;
}

void P2PChannels::post(bool is_send, int peer, const comms::BufferView& buffer, const comms::OpOptions& opts,
                       const c10::intrusive_ptr<CommsWork>& work) {
  auto ch = channel(is_send, peer);
  std::lock_guard<std::mutex> lock(ch->mutex);
  Channel::Posted p{buffer, opts, work};
  if (ch->failed) {
    work->assign_error(ch->failed);
  } else if (ch->comm) {
    ch->issue(p);
  } else {
    work->expect_assignment();
    ch->posted.push_back(std::move(p));
  }
}

void P2PChannels::finalize() {
  std::map<std::pair<bool, int>, std::shared_ptr<Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    channels.swap(channels_);
    ++generation_;
  }
  std::exception_ptr first;
  for (auto& [key, ch] : channels) {
    if (ch->maker.joinable()) ch->maker.join();  // bounded by the init timeout
    if (!ch->comm) continue;
    try {
      ch->comm->finalize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void P2PChannels::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, ch] : channels_) {
    std::lock_guard<std::mutex> channel_lock(ch->mutex);
    if (ch->comm) {
      ch->comm->abort(reason);
      continue;
    }
    // Still being made: what was posted fails now, the comm when it exists.
    ch->aborted = reason;
    ch->failed = std::make_exception_ptr(comms::Error(comms::ErrorCode::kAborted, "send/recv channel: " + reason));
    for (auto& p : ch->posted) p.work->assign_error(ch->failed);
    ch->posted.clear();
  }
}

void P2PChannels::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  op_timeout_ = timeout;
  for (auto& [key, ch] : channels_) {
    std::lock_guard<std::mutex> channel_lock(ch->mutex);
    if (ch->comm) ch->comm->set_timeout(timeout);
  }
}

}  // namespace comms_torch
