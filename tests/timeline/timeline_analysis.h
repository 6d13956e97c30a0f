// The analysis half of gpu_backend_timeline (tests/gpu_backend/gpu_backend_timeline.cc): what a
// traced step's GPU activity records say about where the step's time goes. No CUDA or CUPTI here,
// so CI tests it on synthetic records (timeline_analysis_test.cc); the collector turns CUPTI's
// activity records and graph callbacks into the plain structs below.
//
// A step's records (kernels, memcpys, memsets, times in ns on CUPTI's clock) give:
//   - its wall time (first start to last end), the union of busy time, the time when nothing runs;
//   - per stream: records and busy time; the "main" stream is the one with the most records;
//   - gaps between consecutive records of one stream (next start - previous end; negative when
//     programmatic dependent launch lets the next start under the previous one's tail), per pair
//     of short kernel names;
//   - joins: a record whose producer ran on another stream (a graph edge across streams, or, for
//     records without graph edges, inferred: another stream's record ended after this stream's
//     previous one and before this record started), with their gaps per pair;
//   - the critical path, walked back from the last record to end: each record's binding
//     predecessor is its latest-ending producer (graph edges when the record came from a graph node
//     that has recorded producers, else the stream/join rule above). The path's durations plus its
//     gaps equal the path's span, so "busy on the path" and "gaps on the path" add up to the wall
//     time when the path reaches the step's first record;
//   - layers: the step's kernels cut at each launch of a marker kernel (one that runs once a
//     layer), the segments grouped by what they launch, one representative table per kind.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::timeline {

enum class Kind { kKernel, kMemcpy, kMemset };

struct Record {
  Kind kind = Kind::kKernel;
  std::string name;        // demangled kernel name; "memcpy HtoD" etc. for copies and sets
  std::string short_name;  // ShortKernelName(name): what pairs and tables are keyed by
  uint64_t start = 0, end = 0;
  uint32_t stream = 0;
  uint32_t correlation = 0;
  uint32_t graph_id = 0;    // 0: not launched from a graph
  uint64_t graph_node = 0;  // the node id in the id space Edge uses (0: none)
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t bytes = 0;  // memcpy / memset
};

// A dependency of a captured graph: node `to` waits for node `from` (ids as Record::graph_node).
// `programmatic`: a PDL edge (the consumer may start once the producer triggers or ends).
struct Edge {
  uint64_t from = 0, to = 0;
  bool programmatic = false;
};

// "void tandem::cuda::(anonymous namespace)::Foo<8, true>(float const*, int)" -> "Foo<8,true>":
// the last name component, with template arguments kept (so two instantiations stay apart, spaces
// dropped) and the parameter list gone. Names that do not parse come back as given.
std::string ShortKernelName(const std::string& demangled);

// Host-side [begin, end] timestamps of one step (CUPTI clock): a step's GPU work starts after its
// Step() call begins and ends before it returns (Step synchronizes to copy the logits out).
struct Window {
  uint64_t begin = 0, end = 0;
};
// The records whose start lies in each window, each step's records sorted by start.
std::vector<std::vector<Record>> SplitSteps(const std::vector<Record>& records, const std::vector<Window>& windows);

// Summed statistics keyed by a label (a kernel name or "producer -> consumer").
struct Stat {
  int64_t count = 0;
  int64_t total_ns = 0;
  int64_t min_ns = INT64_MAX, max_ns = INT64_MIN;
  void Add(int64_t v) {
    ++count;
    total_ns += v;
    min_ns = v < min_ns ? v : min_ns;
    max_ns = v > max_ns ? v : max_ns;
  }
};
using StatMap = std::map<std::string, Stat>;

enum class LinkCause { kFirst, kStream, kEdge, kProgrammaticEdge, kInferredJoin };
const char* LinkCauseName(LinkCause c);

struct StreamStat {
  uint32_t stream = 0;
  int64_t records = 0;
  int64_t busy_ns = 0;  // summed durations (overlaps within the stream counted twice)
};

struct PathStep {
  size_t record = 0;   // index into the step's records
  int64_t gap_ns = 0;  // start minus the previous path element's end (0 for the first)
  LinkCause cause = LinkCause::kFirst;
};

struct StepAnalysis {
  uint64_t first_start = 0, last_end = 0;
  int64_t wall_ns = 0;
  int64_t union_busy_ns = 0;  // time when at least one record runs
  int64_t idle_ns = 0;        // wall - union_busy
  int64_t no_kernel_ns = 0;   // wall minus the union of the kernels alone (copies count as idle)
  uint32_t main_stream = 0;
  int64_t main_busy_ns = 0;
  std::vector<StreamStat> streams;                                 // most records first
  std::vector<PathStep> path;                                      // the critical path, in time order
  int64_t path_busy_ns = 0, path_gap_ns = 0, path_overlap_ns = 0;  // gaps > 0 and < 0 summed apart
  StatMap path_kernels;                                            // per short name: on-path count and summed duration
  StatMap path_gaps;       // per "A -> B [cause]": gaps between consecutive path elements
  StatMap stream_gaps;     // per "A -> B" ("[side] A -> B" off the main stream): consecutive pairs of a stream
  StatMap join_gaps;       // per "A -> B": cross-stream producer end to consumer start
  int64_t edges_used = 0;  // records whose predecessors came from graph edges
};

// Analyzes one step. `records` sorted by start (SplitSteps does it). `edges` may be empty; an edge
// through a node that left no record in this step (an empty or event node) is followed through to
// that node's own producers.
StepAnalysis AnalyzeStep(const std::vector<Record>& records, const std::vector<Edge>& edges);

// Layers of one step's kernels (records of other kinds skipped).
struct LayerKind {
  std::string label;             // "gdn", "attention" or "other" (from the kernel names)
  std::vector<size_t> segments;  // indices into Layers::segment_start
  size_t representative = 0;     // the middle one
};
struct Layers {
  std::string marker;                 // the short name cut at; empty when none was found
  std::vector<size_t> kernel_index;   // the step's kernels: indices into its records
  std::vector<size_t> segment_start;  // positions in kernel_index where a layer starts
  std::vector<LayerKind> kinds;       // most segments first
};
// The marker: the earliest-launched short kernel name that runs exactly `n_layers` times (none
// found: marker stays empty and there are no kinds). Segment i runs from marker launch i to the
// next (the last one to the step's end, so it also holds the head); the kernels before the first
// marker (the embedding) are in no segment. Segments are grouped by the multiset of short names
// they launch, so a layer whose side-stream kernels interleave differently still groups with its kind.
Layers FindLayers(const std::vector<Record>& records, int n_layers);

// One representative layer as rows "offset_us dur_us stream name" (offsets from the layer's first
// kernel start), for the summary.
std::string LayerTable(const std::vector<Record>& records, const Layers& layers, const LayerKind& kind);

// Mean-per-step report over several steps' analyses: the step table, the critical path by kernel,
// the gaps by pair (top `top` of each). Plain text.
std::string Summary(const std::vector<StepAnalysis>& steps, const std::vector<std::vector<Record>>& records, int top);

}  // namespace tandem::timeline
