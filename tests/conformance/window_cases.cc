// One-sided windows (comms/window.h): puts of every data type and size land
// byte for byte where they were aimed, signals are counted exactly, puts to
// one peer land in order and before the signal after them, bad offsets are
// refused before anything moves, and finalize, offload and abort release a
// window. A backend without windows answers unsupported, naming itself.
// (A killed peer: tests/mp/fault_test.cc, which can kill a rank.)
#include <cstring>

#include "harness.h"

namespace comms::conformance {
namespace {

using namespace std::chrono_literals;

constexpr uint8_t kSentinel = 0xA5;

std::shared_ptr<Comm> own_comm(Comm& world, const std::string& name) {
  std::vector<int> all(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) all[static_cast<size_t>(r)] = r;
  SplitOptions so;
  so.op_timeout = 60s;
  return world.split(all, name, so);
}

// A window buffer of `bytes` bytes, every byte kSentinel.
Buf sentinel_buf(DeviceMemory& memory, size_t bytes) {
  Buf b(memory, DataType::kUint8, bytes);
  std::memset(b.mutable_host_bytes(), kSentinel, bytes);
  b.view();  // uploads on a device
  return b;
}

// The window's bytes as they are now (read back from a device).
const uint8_t* current_bytes(Buf& b) {
  b.view();  // a device buffer is read back at the next host access
  return b.host_bytes();
}

void expect_code(CaseContext& cx, const std::string& what, ErrorCode want, const std::function<void()>& call,
                 const std::string& must_say = "") {
  try {
    call();
    cx.check.fail(what + " was accepted; expected " + std::string(to_string(want)));
  } catch (const Error& e) {
    if (e.code() != want) {
      cx.check.fail(what + " failed with " + std::string(to_string(e.code())) + ", expected " +
                    std::string(to_string(want)) + ": " + e.what());
    } else if (!must_say.empty() && std::string(e.what()).find(must_say) == std::string::npos) {
      cx.check.fail(what + ": the error does not say '" + must_say + "': " + e.what());
    }
  }
}

// Bytes [from, to) of `got` must all be kSentinel.
void expect_untouched(CaseContext& cx, const uint8_t* got, size_t from, size_t to, const std::string& what) {
  for (size_t i = from; i < to; ++i) {
    if (got[i] != kSentinel) {
      cx.check.fail(what + ": byte " + std::to_string(i) + " was overwritten (" + std::to_string(got[i]) + ")");
      return;
    }
  }
}

void expect_comm_usable(CaseContext& cx, Comm& c, const std::string& after) {
  try {
    Buf b(cx.memory, DataType::kInt32, 1);
    b.set(0, 1);
    c.all_reduce(b.view(), ReduceOp::sum(), op_options(cx.memory));
    if (b.get(0) != c.size()) cx.check.fail("the all_reduce after " + after + " gave " + std::to_string(b.get(0)));
  } catch (const Error& e) {
    cx.check.fail("the all_reduce after " + after + " failed: " + e.what());
  }
}

std::vector<uint64_t> all_of(int n, uint64_t k) { return std::vector<uint64_t>(static_cast<size_t>(n), k); }

// Every rank puts `count` elements of every type to every rank (itself
// too) at `shift` elements into its slot, with a signal; each target waits
// for one signal from each rank and compares every byte of its window.
void put_round(CaseContext& cx, Comm& c, Window& w, Buf& win, size_t slot_bytes, DataType t, size_t count,
               size_t shift) {
  const int n = c.size(), me = c.rank();
  const size_t es = element_size(t);
  std::memset(win.mutable_host_bytes(), kSentinel, win.count());
  win.view();
  c.barrier(op_options(cx.memory));  // every window reset before any put
  std::vector<Buf> sources;
  for (int p = 0; p < n; ++p) {
    sources.emplace_back(cx.memory, t, count);
    for (size_t i = 0; i < count; ++i) sources.back().set(i, data_value(t, me * n + p, i));
  }
  for (int k = 0; k < n; ++k) {
    const int p = (me + k) % n;  // each rank starts with a different target
    w.put(sources[static_cast<size_t>(p)].view(), p, size_t(me) * slot_bytes + shift * es, /*signal=*/true,
          op_options(cx.memory));
  }
  w.wait_signal(all_of(n, 1), op_options(cx.memory));
  const uint8_t* got = current_bytes(win);
  const std::string where = std::string(to_string(t)) + " x" + std::to_string(count) + " at +" +
                            std::to_string(shift) + " elements";
  for (int src = 0; src < n && !cx.check.failed(); ++src) {
    Buf want(t, count);
    for (size_t i = 0; i < count; ++i) want.set(i, data_value(t, src * n + me, i));
    const size_t at = size_t(src) * slot_bytes + shift * es;
    if (std::memcmp(got + at, want.host_bytes(), count * es) != 0) {
      size_t i = 0;
      while (i < count * es && got[at + i] == want.host_bytes()[i]) ++i;
      cx.check.fail("put " + where + " from rank " + std::to_string(src) + ": byte " + std::to_string(i) +
                    " of the slot is " + std::to_string(got[at + i]) + ", expected " +
                    std::to_string(want.host_bytes()[i]));
    }
    expect_untouched(cx, got, size_t(src) * slot_bytes, at, "put " + where + " (before the slot)");
    expect_untouched(cx, got, at + count * es, size_t(src + 1) * slot_bytes, "put " + where + " (after the slot)");
  }
  c.barrier(op_options(cx.memory));  // every check done before the next round's puts
}

void backend_without_windows_says_unsupported(CaseContext& cx, const std::string& backend) {
  if (has_windows(cx.world, cx.memory.device().type)) cx.check.fail("has_windows() changed its answer");
  Buf b(cx.memory, DataType::kUint8, 64);
  // The plugin's name, from "cpu:gloo".
  const std::string name = backend.substr(backend.find(':') + 1);
  expect_code(cx, "register_window", ErrorCode::kUnsupported, [&] { register_window(cx.world, b.view()); },
              "the " + name + " backend");
  expect_comm_usable(cx, cx.world, "a refused register_window");
}

void put_of_every_dtype_and_size_lands_exactly_at_every_peer(CaseContext& cx, bool quick) {
  const std::vector<size_t> counts = {1, 7, quick ? size_t(64 << 10) : size_t(1 << 20)};
  try {
    for (size_t count : counts) {
      const int n = cx.world.size();
      const size_t slot_bytes = count * 8 + 64;  // room for the largest element and a shift of 3
      Buf win = sentinel_buf(cx.memory, slot_bytes * size_t(n));
      Window w = register_window(cx.world, win.view());
      for (DataType t : all_data_types()) {
        // ~1 MiB in bytes, whatever the element size.
        const size_t elems = count > 7 ? count / element_size(t) : count;
        for (size_t shift : count > 7 ? std::vector<size_t>{0} : std::vector<size_t>{0, 3}) {
          put_round(cx, cx.world, w, win, slot_bytes, t, elems, shift);
          if (cx.check.failed()) return;
        }
      }
      w.deregister();
    }
  } catch (const Error& e) {
    cx.check.fail(std::string("window put failed: ") + e.what());
  }
}

void signals_are_counted_exactly_and_a_timed_out_wait_consumes_none(CaseContext& cx) {
  const int n = cx.world.size(), me = cx.world.rank();
  try {
    Buf win = sentinel_buf(cx.memory, 64);
    Window w = register_window(cx.world, win.view());
    constexpr int k = 3;
    for (int i = 0; i < k; ++i) {
      for (int p = 0; p < n; ++p) w.signal(p, op_options(cx.memory));
    }
    w.wait_signal(all_of(n, k), op_options(cx.memory));
    // Nothing more was sent: a further wait times out, promptly, naming a rank.
    OpOptions brief = op_options(cx.memory);
    brief.timeout = 300ms;
    const auto t0 = std::chrono::steady_clock::now();
    expect_code(cx, "a wait for a signal nobody sent", ErrorCode::kTimeout,
                [&] { w.wait_signal(all_of(n, 1), brief); }, "wait_signal");
    if (std::chrono::steady_clock::now() - t0 > 5s) cx.check.fail("the timed-out wait took more than 5 s");
    expect_comm_usable(cx, cx.world, "a timed-out wait_signal");
    // One more from each rank: exactly one each is there, none was taken
    // by the timed-out wait and none is left over.
    for (int p = 0; p < n; ++p) w.signal(p, op_options(cx.memory));
    w.wait_signal(all_of(n, 1), op_options(cx.memory));
    const int left = (me + n - 1) % n;
    expect_code(cx, "a wait for a second extra signal", ErrorCode::kTimeout,
                [&] { w.wait_signal(left, 1, brief); }, "from rank " + std::to_string(left));
    cx.world.barrier(op_options(cx.memory));
    w.deregister();
  } catch (const Error& e) {
    cx.check.fail(std::string("signals: ") + e.what());
  }
}

void puts_to_one_peer_land_in_order_and_before_the_signal_after_them(CaseContext& cx, bool quick) {
  const int n = cx.world.size(), me = cx.world.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const size_t count = 1024, big = quick ? 64 << 10 : 256 << 10;  // int32 elements
  try {
    Buf win = sentinel_buf(cx.memory, (count + big) * 4);
    Window w = register_window(cx.world, win.view());
    // Five puts to one place, the last with the signal: the last wins.
    std::vector<Buf> versions;
    for (int v = 0; v < 5; ++v) {
      versions.emplace_back(cx.memory, DataType::kInt32, count);
      for (size_t i = 0; i < count; ++i) versions.back().set(i, double(me * 1000 + v * 100 + int(i % 97)));
    }
    for (int v = 0; v < 5; ++v) {
      // Odd versions asynchronous: their Work completes, and order holds.
      Work done = w.put(versions[size_t(v)].view(), right, 0, v == 4, op_options(cx.memory, v % 2 == 1));
      done.wait();
    }
    // Then a large put without a signal, and a signal on its own.
    Buf large(cx.memory, DataType::kInt32, big);
    for (size_t i = 0; i < big; ++i) large.set(i, double(me * 7 + int(i % 1013)));
    w.put(large.view(), right, count * 4, false, op_options(cx.memory));
    w.signal(right, op_options(cx.memory));
    w.wait_signal(left, 2, op_options(cx.memory));
    Buf got(DataType::kInt32, count + big);
    std::memcpy(got.mutable_host_bytes(), current_bytes(win), (count + big) * 4);
    cx.check.values(got, 0, count, {"put", DataType::kInt32, "", count, -1, "sync", "the last of five puts"},
                    [&](size_t i) { return double(left * 1000 + 400 + int(i % 97)); });
    cx.check.values(got, count, big, {"put", DataType::kInt32, "", big, -1, "sync", "data before its signal"},
                    [&](size_t i) { return double(left * 7 + int(i % 1013)); });
    w.flush(op_options(cx.memory));
    cx.world.barrier(op_options(cx.memory));
    w.deregister();
  } catch (const Error& e) {
    cx.check.fail(std::string("ordering: ") + e.what());
  }
}

void bad_offsets_sizes_and_peers_are_refused_before_anything_moves(CaseContext& cx) {
  const int n = cx.world.size(), me = cx.world.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  try {
    // Sizes differ per rank: offsets are checked against the peer's.
    const size_t mine = 64 * size_t(me + 1);
    Buf win = sentinel_buf(cx.memory, mine);
    Window w = register_window(cx.world, win.view());
    for (int p = 0; p < n; ++p) {
      if (w.size_of(p) != 64 * size_t(p + 1)) {
        cx.check.fail("size_of(" + std::to_string(p) + ") is " + std::to_string(w.size_of(p)));
      }
    }
    const size_t theirs = w.size_of(right);
    Buf src(cx.memory, DataType::kUint8, 8);
    for (size_t i = 0; i < 8; ++i) src.set(i, double(i + 1));
    for (bool async : {false, true}) {
      const OpOptions o = op_options(cx.memory, async);
      const std::string mode = async ? " (async)" : " (sync)";
      expect_code(cx, "a put past the end of the peer's window" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(src.view(), right, theirs - 4, true, o).wait(); }, "do not fit rank");
      expect_code(cx, "a put at an offset past the window" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(src.view(0, 0), right, theirs + 1, true, o).wait(); });
      expect_code(cx, "a put at offset SIZE_MAX" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(src.view(), right, SIZE_MAX, true, o).wait(); });
      expect_code(cx, "a put to rank " + std::to_string(n) + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(src.view(), n, 0, true, o).wait(); }, "out of range");
      expect_code(cx, "a signal to rank -1" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.signal(-1, o).wait(); }, "out of range");
      expect_code(cx, "a wait with size()+1 counts" + mode, ErrorCode::kInvalidArgument, [&] {
        const auto counts = all_of(n + 1, 0);
        w.wait_signal(counts, o).wait();
      });
      const DeviceType other = cx.memory.device().type == DeviceType::kCpu ? DeviceType::kCuda : DeviceType::kCpu;
      BufferView elsewhere = src.view();
      elsewhere.device = Device{other, other == DeviceType::kCpu ? -1 : 0};
      expect_code(cx, "a put from a buffer on another device" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(elsewhere, right, 0, true, o).wait(); }, "the window is on");
      OpOptions tagged = o;
      tagged.tag = 7;
      expect_code(cx, "a put with a tag" + mode, ErrorCode::kInvalidArgument,
                  [&] { w.put(src.view(), right, 0, true, tagged).wait(); }, "tag");
    }
    // Nothing moved: no byte changed and no signal came.
    cx.world.barrier(op_options(cx.memory));
    expect_untouched(cx, current_bytes(win), 0, mine, "after refused puts");
    OpOptions brief = op_options(cx.memory);
    brief.timeout = 200ms;
    expect_code(cx, "a wait for a signal of a refused put", ErrorCode::kTimeout,
                [&] { w.wait_signal(left, 1, brief); });
    cx.world.barrier(op_options(cx.memory));  // every timed wait over before the next signal
    // The put that just fits works.
    w.put(src.view(), right, theirs - 8, true, op_options(cx.memory));
    w.wait_signal(left, 1, op_options(cx.memory));
    const uint8_t* got = current_bytes(win);
    for (size_t i = 0; i < 8; ++i) {
      if (got[mine - 8 + i] != i + 1) {
        cx.check.fail("the put that fits the window's end: byte " + std::to_string(i) + " is " +
                      std::to_string(got[mine - 8 + i]));
        break;
      }
    }
    expect_untouched(cx, got, 0, mine - 8, "before the put that fits the end");
    cx.world.barrier(op_options(cx.memory));
    w.deregister();
    expect_code(cx, "a put after deregister()", ErrorCode::kInvalidArgument,
                [&] { w.put(src.view(), right, 0); }, "deregistered");
  } catch (const Error& e) {
    cx.check.fail(std::string("bad arguments: ") + e.what());
  }
}

void offload_finalize_and_abort_release_windows(CaseContext& cx) {
  const int n = cx.world.size(), me = cx.world.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const DeviceType type = cx.memory.device().type;
  try {
    auto c = own_comm(cx.world, "conformance-windows-life");
    Buf win = sentinel_buf(cx.memory, 64);
    Buf src(cx.memory, DataType::kUint8, 8);
    for (size_t i = 0; i < 8; ++i) src.set(i, double(40 + i));
    Window w = register_window(*c, win.view());
    w.put(src.view(), right, 0, true, op_options(cx.memory));
    w.wait_signal(left, 1, op_options(cx.memory));
    c->offload_backend(type);
    if (w.registered()) cx.check.fail("the window is still registered after offload_backend");
    expect_code(cx, "a put after offload", ErrorCode::kInvalidArgument,
                [&] { w.put(src.view(), right, 0); }, "offloaded");
    c->reload_backend(type);
    if (w.registered()) cx.check.fail("a window from before the offload is registered after reload");
    expect_code(cx, "a put through a window from before the reload", ErrorCode::kInvalidArgument,
                [&] { w.signal(right); }, "offloaded");
    w.deregister();  // released with the backend: nothing to do
    Window again = register_window(*c, win.view());
    again.put(src.view(), right, 8, true, op_options(cx.memory));
    again.wait_signal(left, 1, op_options(cx.memory));
    if (current_bytes(win)[8] != 40) cx.check.fail("the put through a window registered after reload did not land");
    c->barrier(op_options(cx.memory));
    c->finalize();
    if (again.registered()) cx.check.fail("the window is still registered after finalize");
    expect_code(cx, "a put after finalize", ErrorCode::kInvalidArgument,
                [&] { again.put(src.view(), right, 0); }, "finalized");
    again.deregister();

    auto d = own_comm(cx.world, "conformance-windows-abort");
    Window doomed = register_window(*d, win.view());
    d->abort("conformance: a window's comm aborted");
    if (doomed.registered()) cx.check.fail("the window is still registered after abort");
    expect_code(cx, "a put after abort", ErrorCode::kAborted, [&] { doomed.put(src.view(), right, 0); });
    doomed.deregister();
    try {
      d->finalize();
    } catch (const Error&) {
      // An aborted comm may report what it could not release.
    }
  } catch (const Error& e) {
    cx.check.fail(std::string("lifecycle: ") + e.what());
  }
  try {
    cx.world.barrier(op_options(cx.memory));
  } catch (const Error& e) {
    cx.check.fail(std::string("world barrier after the window lifecycle: ") + e.what());
  }
}
}  // namespace

void add_window_cases(bool has_windows_, const std::string& backend, const SuiteOptions& options,
                      std::vector<Case>* cases) {
  auto add = [&](const std::string& name, std::string skip, std::function<void(CaseContext&)> body) {
    cases->push_back({"world/windows/" + name, "windows", std::move(skip), std::move(body)});
  };
  const std::string needs_windows =
      has_windows_ ? "" : "the backend has no windows (world/windows/backend_without_windows_says_unsupported)";
  const bool quick = options.quick;
  add("backend_without_windows_says_unsupported", has_windows_ ? "the backend has windows" : "",
      [=](CaseContext& cx) { backend_without_windows_says_unsupported(cx, backend); });
  add("put_of_every_dtype_and_size_lands_exactly_at_every_peer", needs_windows,
      [=](CaseContext& cx) { put_of_every_dtype_and_size_lands_exactly_at_every_peer(cx, quick); });
  add("signals_are_counted_exactly_and_a_timed_out_wait_consumes_none", needs_windows,
      [=](CaseContext& cx) { signals_are_counted_exactly_and_a_timed_out_wait_consumes_none(cx); });
  add("puts_to_one_peer_land_in_order_and_before_the_signal_after_them", needs_windows,
      [=](CaseContext& cx) { puts_to_one_peer_land_in_order_and_before_the_signal_after_them(cx, quick); });
  add("bad_offsets_sizes_and_peers_are_refused_before_anything_moves", needs_windows,
      [=](CaseContext& cx) { bad_offsets_sizes_and_peers_are_refused_before_anything_moves(cx); });
  add("offload_finalize_and_abort_release_windows", needs_windows,
      [=](CaseContext& cx) { offload_finalize_and_abort_release_windows(cx); });
}

}  // namespace comms::conformance
