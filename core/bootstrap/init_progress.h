// How far each rank got in connecting a backend, recorded in the store so
// that an init timeout names the rank(s) that never came, or got least far,
// rather than whichever key this rank happened to wait for (a healthy rank's
// key when that rank is itself stuck waiting for the missing one).
//
// Under "<prefix>#" each rank sets arrived/<rank> before the backend connects
// and ready/<rank> after, and counts the keys its backend writes in
// progress/<rank>. Costs one store round trip per key the backend writes and
// two per init; read back only when an init times out.
#pragma once

#include <memory>
#include <string>

#include "comms/store.h"

namespace comms::internal {

class InitProgress {
 public:
  InitProgress(std::shared_ptr<Store> store, std::string prefix, int rank, int size)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

  // `backend_store`, counting this rank's writes.
  std::shared_ptr<Store> counting(std::shared_ptr<Store> backend_store) const;
  void arrived() const { mark("arrived"); }
  void finished() const { mark("ready"); }
  // "rank 2 of 4 never arrived at this init" and the like, or "" when the
  // store cannot tell.
  std::string laggards() const;

 private:
  void mark(const char* what) const;
  std::string key(const char* what, int rank) const;

  std::shared_ptr<Store> store_;
  std::string prefix_;
  int rank_;
  int size_;
};

}  // namespace comms::internal
