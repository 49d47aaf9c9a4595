#include <gtest/gtest.h>

#include <vector>

#include "comm/validate.h"

namespace comms::internal {
namespace {

using plugin::OpType;

Status check(const OpArgs& a, int rank = 1, int size = 4, Checked* out = nullptr) {
  Checked c;
  return validate(a, rank, size, out ? out : &c);
}

OpArgs op(OpType t, BufferView in, BufferView out) {
  OpArgs a;
  a.type = t;
  a.input = in;
  a.output = out;
  return a;
}

TEST(Validate, AllReduceDetectsInPlaceAndRejectsCountTypeAndDeviceMismatch) {
  std::vector<float> a(8), b(8);
  Checked c;
  EXPECT_TRUE(check(op(OpType::kAllReduce, BufferView::of(a), BufferView::of(a)), 1, 4, &c).is_ok());
  EXPECT_TRUE(c.in_place);
  EXPECT_TRUE(check(op(OpType::kAllReduce, BufferView::of(a), BufferView::of(b)), 1, 4, &c).is_ok());
  EXPECT_FALSE(c.in_place);
  EXPECT_EQ(c.count, 8u);

  auto short_out = BufferView::of(b.data(), 7);
  Status s = check(op(OpType::kAllReduce, BufferView::of(a), short_out));
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("output has 7 elements; expected 8"), std::string::npos) << s.message;

  std::vector<double> d(8);
  s = check(op(OpType::kAllReduce, BufferView::of(a), BufferView::of(d)));
  EXPECT_NE(s.message.find("output is float64 but input is float32"), std::string::npos) << s.message;

  auto gpu = BufferView::of(b);
  gpu.device = Device::cuda(0);
  s = check(op(OpType::kAllReduce, BufferView::of(a), gpu));
  EXPECT_NE(s.message.find("on cuda:0 but input is on cpu"), std::string::npos) << s.message;

  s = check(op(OpType::kAllReduce, BufferView::of(a.data(), 8), BufferView::of(a.data() + 2, 8)));
  EXPECT_NE(s.message.find("overlap"), std::string::npos) << s.message;
}

TEST(Validate, NullBufferWithElementsIsRejected) {
  BufferView null_view{nullptr, 4, DataType::kInt32, Device::cpu()};
  Status s = check(op(OpType::kAllReduce, null_view, null_view));
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("input is null but has 4 elements"), std::string::npos) << s.message;
  BufferView empty{nullptr, 0, DataType::kInt32, Device::cpu()};
  EXPECT_TRUE(check(op(OpType::kAllReduce, empty, empty)).is_ok());
}

TEST(Validate, UndefinedReductionsAreUnsupported) {
  std::vector<float> a(4);
  OpArgs args = op(OpType::kAllReduce, BufferView::of(a), BufferView::of(a));
  args.reduce = ReduceOp::bxor();
  Status s = check(args);
  EXPECT_EQ(s.code, ErrorCode::kUnsupported);
  EXPECT_NE(s.message.find("'bxor' is not defined for float32"), std::string::npos) << s.message;
}

TEST(Validate, RootsAndPeersMustBeInRange) {
  std::vector<int> a(4);
  OpArgs b = op(OpType::kBroadcast, BufferView::of(a), BufferView::of(a));
  b.root = 4;
  EXPECT_NE(check(b).message.find("root 4 is out of range [0, 4)"), std::string::npos);
  b.root = -1;
  EXPECT_EQ(check(b).code, ErrorCode::kInvalidArgument);
  OpArgs s = op(OpType::kSend, BufferView::of(a), {});
  s.peer = 1;  // this rank
  EXPECT_NE(check(s).message.find("peer 1 is this rank itself"), std::string::npos);
  s.peer = 9;
  EXPECT_NE(check(s).message.find("peer 9 is out of range"), std::string::npos);
}

TEST(Validate, AllGatherKnowsItsInPlaceSlice) {
  std::vector<int> out(12);
  Checked c;
  // rank 1 of 4, 3 elements each: in place when input is out[3..6).
  EXPECT_TRUE(check(op(OpType::kAllGather, BufferView::of(out.data() + 3, 3), BufferView::of(out)), 1, 4, &c).is_ok());
  EXPECT_TRUE(c.in_place);
  Status s = check(op(OpType::kAllGather, BufferView::of(out.data() + 2, 3), BufferView::of(out)));
  EXPECT_NE(s.message.find("not its slice for rank 1"), std::string::npos) << s.message;
  std::vector<int> in(3);
  s = check(op(OpType::kAllGather, BufferView::of(in), BufferView::of(out.data(), 11)));
  EXPECT_NE(s.message.find("expected 12 (input count 3 x world size 4)"), std::string::npos) << s.message;
}

TEST(Validate, VariableCountsMustHaveOneEntryPerRankAndMatchTheBuffers) {
  std::vector<int> in(5), out(10);
  std::vector<size_t> counts = {1, 5, 2, 2};
  OpArgs a = op(OpType::kAllGatherV, BufferView::of(in), BufferView::of(out));
  a.counts = counts;
  EXPECT_TRUE(check(a).is_ok());
  std::vector<size_t> three = {1, 5, 4};
  a.counts = three;
  EXPECT_NE(check(a).message.find("counts has 3 entries; expected one per rank (4)"), std::string::npos);
  std::vector<size_t> wrong_mine = {1, 4, 3, 2};
  a.counts = wrong_mine;
  EXPECT_NE(check(a).message.find("counts[1] for this rank"), std::string::npos);

  OpArgs v = op(OpType::kAllToAllV, BufferView::of(in), BufferView::of(out));
  std::vector<size_t> send = {1, 1, 1, 2}, recv = {4, 3, 2, 1};
  v.counts = send;
  v.output_counts = recv;
  EXPECT_TRUE(check(v).is_ok());
  std::vector<size_t> bad_recv = {4, 3, 2, 0};
  v.output_counts = bad_recv;
  EXPECT_NE(check(v).message.find("the sum of output_counts"), std::string::npos);
}

TEST(Validate, ReduceScatterAndAllToAllNeedWholeBlocks) {
  std::vector<float> in(8), out(2);
  Checked c;
  EXPECT_TRUE(check(op(OpType::kReduceScatter, BufferView::of(in), BufferView::of(out)), 1, 4, &c).is_ok());
  EXPECT_EQ(c.count, 2u);
  EXPECT_TRUE(check(op(OpType::kReduceScatter, BufferView::of(in), BufferView::of(in.data() + 2, 2)), 1, 4, &c).is_ok());
  EXPECT_TRUE(c.in_place);
  std::vector<float> odd(7);
  EXPECT_NE(check(op(OpType::kAllToAll, BufferView::of(odd), BufferView::of(odd))).message.find("not a multiple"),
            std::string::npos);
}

TEST(Validate, GatherAndScatterCheckTheRootBufferOnlyOnTheRoot) {
  std::vector<int> in(2), out(8);
  OpArgs g = op(OpType::kGather, BufferView::of(in), {});
  g.root = 0;
  EXPECT_TRUE(check(g, 1, 4).is_ok());  // non-root: no output needed
  EXPECT_EQ(check(g, 0, 4).code, ErrorCode::kInvalidArgument);  // root without output
  g.output = BufferView::of(out);
  EXPECT_TRUE(check(g, 0, 4).is_ok());
  OpArgs s = op(OpType::kScatter, {}, BufferView::of(in));
  s.root = 2;
  EXPECT_TRUE(check(s, 1, 4).is_ok());
  EXPECT_EQ(check(s, 2, 4).code, ErrorCode::kInvalidArgument);
}

TEST(Validate, BatchP2PKeepsOneDeviceTypeAndValidPeers) {
  std::vector<int> a(2), b(2);
  auto gpu = BufferView::of(b);
  gpu.device = Device::cuda(0);
  std::vector<P2POp> ops = {P2POp::send(BufferView::of(a), 0), P2POp::recv(gpu, 2)};
  OpArgs args;
  args.type = OpType::kBatchP2P;
  args.p2p = ops;
  EXPECT_NE(check(args).message.find("a batch runs on one device type"), std::string::npos);
  ops[1] = P2POp::recv(BufferView::of(b), 1);
  EXPECT_NE(check(args).message.find("is this rank itself"), std::string::npos);
  ops[1] = P2POp::recv(BufferView::of(b), 3);
  EXPECT_TRUE(check(args).is_ok());
}

}  // namespace
}  // namespace comms::internal
