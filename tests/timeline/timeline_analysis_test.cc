// The timeline analysis (timeline_analysis.h) on synthetic records: two streams, a programmatic
// (PDL) overlap, a fork through a node that leaves no record, a join; with graph edges and without
// (the stream / inferred-join rule). CPU only.
#include "tests/timeline/timeline_analysis.h"

#include <gtest/gtest.h>

namespace tandem::timeline {
namespace {

Record K(const std::string& name, uint64_t start, uint64_t end, uint32_t stream, uint64_t node = 0) {
  Record r;
  r.name = name;
  r.short_name = name;
  r.start = start;
  r.end = end;
  r.stream = stream;
  r.graph_node = node;
  return r;
}

// Main stream 1: A [0,10], B [8,20] (starts under A's tail: PDL), C [25,30], D [40,50].
// Side stream 2: S [22,38], forked after B through an unrecorded node 9; D waits for C and S.
std::vector<Record> Step() {
  return {K("A", 0, 10, 1, 1), K("B", 8, 20, 1, 2), K("S", 22, 38, 2, 5), K("C", 25, 30, 1, 3), K("D", 40, 50, 1, 4)};
}
std::vector<Edge> Edges() {
  return {{1, 2, true}, {2, 3, false}, {3, 4, false}, {2, 9, false}, {9, 5, false}, {5, 4, false}};
}

TEST(TimelineAnalysis, ShortKernelName) {
  EXPECT_EQ(ShortKernelName("void tandem::cuda::(anonymous namespace)::GdnChunkScan<64, true>(float const*, int)"),
            "GdnChunkScan<64,true>");
  EXPECT_EQ(ShortKernelName("void ns::K<ns::Q8, 4>(int)"), "K<ns::Q8,4>");
  EXPECT_EQ(ShortKernelName("Foo"), "Foo");
  EXPECT_EQ(ShortKernelName("ns::Bar(int)"), "Bar");
}

TEST(TimelineAnalysis, SplitStepsByHostWindows) {
  std::vector<Record> all = Step();
  for (Record r : Step()) {  // a second step 1000 ns later, given out of order
    r.start += 1000;
    r.end += 1000;
    all.insert(all.begin(), r);
  }
  const auto steps = SplitSteps(all, {{0, 500}, {990, 1500}});
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].size(), 5u);
  ASSERT_EQ(steps[1].size(), 5u);
  EXPECT_EQ(steps[1][0].name, "A");
  EXPECT_EQ(steps[1][2].name, "S");  // sorted by start
}

TEST(TimelineAnalysis, WithGraphEdges) {
  const std::vector<Record> recs = Step();
  const StepAnalysis a = AnalyzeStep(recs, Edges());
  EXPECT_EQ(a.wall_ns, 50);
  EXPECT_EQ(a.union_busy_ns, 46);  // [0,20] [22,38] [40,50]
  EXPECT_EQ(a.idle_ns, 4);
  EXPECT_EQ(a.no_kernel_ns, 4);  // every record a kernel
  EXPECT_EQ(a.main_stream, 1u);
  EXPECT_EQ(a.main_busy_ns, 10 + 12 + 5 + 10);
  ASSERT_EQ(a.streams.size(), 2u);
  EXPECT_EQ(a.edges_used, 4);  // B, C, D, S (A is a root)
  // The path: A -(pdl, -2)-> B -(fork through node 9, +2)-> S -(join, +2)-> D; C is off the path.
  ASSERT_EQ(a.path.size(), 4u);
  EXPECT_EQ(recs[a.path[0].record].name, "A");
  EXPECT_EQ(recs[a.path[1].record].name, "B");
  EXPECT_EQ(a.path[1].cause, LinkCause::kProgrammaticEdge);
  EXPECT_EQ(a.path[1].gap_ns, -2);
  EXPECT_EQ(recs[a.path[2].record].name, "S");
  EXPECT_EQ(a.path[2].cause, LinkCause::kEdge);
  EXPECT_EQ(recs[a.path[3].record].name, "D");
  EXPECT_EQ(a.path[3].gap_ns, 2);
  EXPECT_EQ(a.path_busy_ns, 10 + 12 + 16 + 10);
  EXPECT_EQ(a.path_gap_ns, 4);
  EXPECT_EQ(a.path_overlap_ns, -2);
  EXPECT_EQ(a.path_busy_ns + a.path_gap_ns + a.path_overlap_ns, a.wall_ns);  // the path spans the step
  EXPECT_EQ(a.path_gaps.at("A -> B [pdl-edge]").total_ns, -2);
  EXPECT_EQ(a.path_gaps.at("S -> D [edge]").total_ns, 2);
  // Same-stream pairs, overlaps negative; joins only across streams.
  EXPECT_EQ(a.stream_gaps.at("A -> B").total_ns, -2);
  EXPECT_EQ(a.stream_gaps.at("B -> C").total_ns, 5);
  EXPECT_EQ(a.stream_gaps.at("C -> D").total_ns, 10);
  EXPECT_EQ(a.stream_gaps.size(), 3u);  // S alone on its stream: no pair
  ASSERT_EQ(a.join_gaps.size(), 2u);
  EXPECT_EQ(a.join_gaps.at("B -> S").total_ns, 2);
  EXPECT_EQ(a.join_gaps.at("S -> D").total_ns, 2);
  EXPECT_EQ(a.path_kernels.at("S").total_ns, 16);
}

TEST(TimelineAnalysis, WithoutEdgesInfersJoins) {
  std::vector<Record> recs = Step();
  const StepAnalysis a = AnalyzeStep(recs, {});
  EXPECT_EQ(a.edges_used, 0);
  // S: no stream predecessor; B ended at 20 before it started at 22 (A at 10): joined from B.
  // D: its stream's C ended at 30, S at 38: joined from S. B follows A on the stream.
  ASSERT_EQ(a.path.size(), 4u);
  EXPECT_EQ(recs[a.path[1].record].name, "B");
  EXPECT_EQ(a.path[1].cause, LinkCause::kStream);
  EXPECT_EQ(recs[a.path[2].record].name, "S");
  EXPECT_EQ(a.path[2].cause, LinkCause::kInferredJoin);
  EXPECT_EQ(recs[a.path[3].record].name, "D");
  EXPECT_EQ(a.path[3].cause, LinkCause::kInferredJoin);
  EXPECT_EQ(a.join_gaps.at("B -> S").total_ns, 2);
  EXPECT_EQ(a.join_gaps.at("S -> D").total_ns, 2);
  EXPECT_EQ(a.path_busy_ns + a.path_gap_ns + a.path_overlap_ns, a.wall_ns);

  // The side stream ends before its join is needed: D follows C on its stream, not S.
  recs[2].end = 28;
  const StepAnalysis b = AnalyzeStep(recs, {});
  EXPECT_EQ(b.path.back().cause, LinkCause::kStream);
  EXPECT_EQ(recs[b.path[b.path.size() - 2].record].name, "C");
  EXPECT_EQ(b.path_busy_ns + b.path_gap_ns + b.path_overlap_ns, b.wall_ns);
}

TEST(TimelineAnalysis, EmptyStep) {
  const StepAnalysis a = AnalyzeStep({}, {});
  EXPECT_EQ(a.wall_ns, 0);
  EXPECT_TRUE(a.path.empty());
}

TEST(TimelineAnalysis, LayersFromTheMarker) {
  // Embedding, then 4 layers (gdn, gdn, attention, gdn) each opened by Norm, the head after the last.
  std::vector<Record> recs;
  uint64_t t = 0;
  auto add = [&](const std::string& name, uint32_t stream = 1) {
    recs.push_back(K(name, t, t + 5, stream));
    t += 6;
  };
  add("Embed");
  for (const char* mixer : {"GdnScan", "GdnScan", "AttentionDecode", "GdnScan"}) {
    add("Norm");
    add(mixer);
    add("Shared", 2);
    add("Moe");
  }
  add("Head");
  Record copy = K("memcpy DtoH", t, t + 3, 1);
  copy.kind = Kind::kMemcpy;
  recs.push_back(copy);
  const StepAnalysis an = AnalyzeStep(recs, {});
  EXPECT_EQ(an.no_kernel_ns, an.idle_ns + 3);  // the trailing copy runs while no kernel does
  const Layers l = FindLayers(recs, 4);
  EXPECT_EQ(l.marker, "Norm");            // Norm, Shared and Moe run 4 times; Norm is launched first
  EXPECT_EQ(l.kernel_index.size(), 18u);  // the memcpy is not a kernel
  ASSERT_EQ(l.segment_start.size(), 4u);
  EXPECT_EQ(l.segment_start[0], 1u);
  ASSERT_EQ(l.kinds.size(), 3u);  // gdn, attention, gdn + head
  EXPECT_EQ(l.kinds[0].label, "gdn");
  EXPECT_EQ(l.kinds[0].segments.size(), 2u);
  EXPECT_EQ(l.kinds[1].label, "attention");
  const std::string table = LayerTable(recs, l, l.kinds[1]);
  EXPECT_NE(table.find("AttentionDecode"), std::string::npos);
  EXPECT_NE(table.find("Shared"), std::string::npos);
  EXPECT_EQ(table.find("GdnScan"), std::string::npos);

  EXPECT_TRUE(FindLayers(recs, 7).marker.empty());
}

TEST(TimelineAnalysis, SummaryNamesTheLargestItems) {
  const std::vector<Record> recs = Step();
  const std::vector<StepAnalysis> a = {AnalyzeStep(recs, Edges())};
  const std::string s = Summary(a, {recs}, 10);
  EXPECT_NE(s.find("S -> D [edge]"), std::string::npos);
  EXPECT_NE(s.find("critical path by kernel"), std::string::npos);
}

}  // namespace
}  // namespace tandem::timeline
