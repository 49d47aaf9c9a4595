// comms::Comm: the public handle, forwarding to Comm::Impl.
#include "comm/comm_impl.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms {

Comm::Comm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Comm::~Comm() {
  try {
    impl_->finalize();
  } catch (const std::exception& e) {
    log::error(str::cat("destroying comm: ", e.what()));
  }
}

const std::string& Comm::name() const { return impl_->config().name; }
int Comm::rank() const { return impl_->config().rank; }
int Comm::size() const { return impl_->config().size; }
const BackendSpec& Comm::backends() const { return impl_->config().spec; }
std::optional<Device> Comm::device() const { return impl_->config().bound_device; }
std::chrono::milliseconds Comm::init_timeout() const { return impl_->config().init_timeout; }
std::chrono::milliseconds Comm::op_timeout() const { return impl_->op_timeout(); }
Hints Comm::hints() const { return impl_->hints(); }
bool Comm::abort_process_on_error() const { return impl_->config().abort_process_on_error; }
bool Comm::elastic() const { return impl_->config().elastic; }
BackendState Comm::backend_state(DeviceType t) const { return impl_->state(t); }
bool Comm::is_failed() const { return impl_->is_failed(); }

void Comm::set_timeout(std::chrono::milliseconds op_timeout) { impl_->set_timeout(op_timeout); }
void Comm::set_hints(const Hints& hints) { impl_->set_hints(hints); }
void Comm::abort(const std::string& reason) { impl_->abort(reason); }
void Comm::finalize() { impl_->finalize(); }
bool Comm::offload_backend(DeviceType type) { return impl_->offload(type); }
bool Comm::reload_backend(DeviceType type) { return impl_->reload(type); }
std::string Comm::describe() const { return impl_->describe(); }

}  // namespace comms
