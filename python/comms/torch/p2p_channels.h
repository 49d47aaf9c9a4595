// Sends and receives that start when issued.
//
// comms runs a comm's ops in issue order, so an isend and an irecv that
// cross between two ranks would wait for each other on the group's comm. As
// NCCL's backend keeps a communicator per pair of ranks, a group here keeps a
// two-rank comm per peer and direction (its "channel"): rank a's sends to b
// and b's receives from a are the only ops on channel a->b, so they match in
// order and never wait behind anything else. A channel is made on first use
// by a thread of its own (making it waits for the peer, which may be busy
// elsewhere); what is posted meanwhile is issued, in order, once it exists.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comms/comm.h"

namespace comms_torch {

class CommsWork;
struct GroupConfig;

class P2PChannels {
 public:
  // Channels are named after the group's comm (config.name) and bootstrap
  // through the group's store; `rank` is this process's rank in the group.
  P2PChannels(c10::intrusive_ptr<c10d::Store> store, const GroupConfig& config, std::string backend, int rank);
  ~P2PChannels();
  P2PChannels(const P2PChannels&) = delete;
  P2PChannels& operator=(const P2PChannels&) = delete;

  // Issues the send or recv on its channel now, or as soon as the channel
  // exists; `work` gets the comms work (or the error that stopped it).
  void post(bool is_send, int peer, const comms::BufferView& buffer, const comms::OpOptions& opts,
            const c10::intrusive_ptr<CommsWork>& work);
  // Waits for the channels being made, then finalizes every channel (and
  // throws the first failure to). A later post makes new channels.
  void finalize();
  // Aborts every channel; safe from any thread.
  void abort(const std::string& reason);
  // The op timeout of every channel, made or to be made.
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  struct Channel;
  std::shared_ptr<Channel> channel(bool is_send, int peer);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string name_;
  std::string backend_;
  comms::Hints hints_;
  std::optional<std::chrono::milliseconds> op_timeout_;
  std::optional<std::chrono::milliseconds> init_timeout_;
  int rank_;
  uint64_t generation_ = 0;  // bumped by finalize: new channels get new names
  std::mutex mutex_;
  std::map<std::pair<bool, int>, std::shared_ptr<Channel>> channels_;
};

}  // namespace comms_torch
