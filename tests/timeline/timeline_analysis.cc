#include "tests/timeline/timeline_analysis.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <unordered_map>
#include <utility>

namespace tandem::timeline {
namespace {

int64_t Dur(const Record& r) { return static_cast<int64_t>(r.end) - static_cast<int64_t>(r.start); }

std::string Pair(const Record& a, const Record& b) { return a.short_name + " -> " + b.short_name; }

// Sorted by mean total per step, largest first; at most `top` rows.
std::vector<std::pair<std::string, Stat>> Top(const StatMap& m, int top) {
  std::vector<std::pair<std::string, Stat>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    const int64_t x = a.second.total_ns < 0 ? -a.second.total_ns : a.second.total_ns;
    const int64_t y = b.second.total_ns < 0 ? -b.second.total_ns : b.second.total_ns;
    return x != y ? x > y : a.first < b.first;
  });
  if (top >= 0 && v.size() > static_cast<size_t>(top)) v.resize(static_cast<size_t>(top));
  return v;
}

void Merge(StatMap& into, const StatMap& from) {
  for (const auto& [k, s] : from) {
    Stat& t = into[k];
    t.count += s.count;
    t.total_ns += s.total_ns;
    t.min_ns = std::min(t.min_ns, s.min_ns);
    t.max_ns = std::max(t.max_ns, s.max_ns);
  }
}

// Rows "count/step  total us/step  mean us  min  max  label".
std::string StatTable(const StatMap& m, int steps, int top, const char* what) {
  std::string out = std::string("     n/step  us/step  mean us   min us   max us  ") + what + "\n";
  for (const auto& [k, s] : Top(m, top)) {
    char line[512];
    snprintf(line, sizeof(line), "  %9.1f %8.1f %8.2f %8.2f %8.2f  %s\n", static_cast<double>(s.count) / steps,
             1e-3 * s.total_ns / steps, 1e-3 * s.total_ns / std::max<int64_t>(1, s.count), 1e-3 * s.min_ns,
             1e-3 * s.max_ns, k.c_str());
    out += line;
  }
  return out;
}

}  // namespace

std::string ShortKernelName(const std::string& demangled) {
  // Cut the parameter list: the first '(' at template depth 0 (an "(anonymous namespace)" component
  // is a name component, not a parameter list: skip it).
  std::string s = demangled;
  {
    int depth = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '<') ++depth;
      if (c == '>') --depth;
      if (c == '(' && depth == 0) {
        if (s.compare(i, 21, "(anonymous namespace)") == 0) {
          i += 20;
          continue;
        }
        s.resize(i);
        break;
      }
    }
  }
  // The last "::" component at template depth 0.
  int depth = 0;
  size_t last = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ':' && s[i + 1] == ':') last = i + 2;
  }
  s = s.substr(last);
  // A leading return type ("void Foo<...>"): the last space at depth 0 before the name.
  depth = 0;
  size_t name_at = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ' ') name_at = i + 1;
  }
  s = s.substr(name_at);
  std::string out;
  for (char c : s) {
    if (c != ' ') out += c;
  }
  return out.empty() ? demangled : out;
}

const char* LinkCauseName(LinkCause c) {
  switch (c) {
    case LinkCause::kFirst:
      return "first";
    case LinkCause::kStream:
      return "stream";
    case LinkCause::kEdge:
      return "edge";
    case LinkCause::kProgrammaticEdge:
      return "pdl-edge";
    case LinkCause::kInferredJoin:
      return "join?";
  }
  return "?";
}

std::vector<std::vector<Record>> SplitSteps(const std::vector<Record>& records, const std::vector<Window>& windows) {
  std::vector<std::vector<Record>> steps(windows.size());
  for (const Record& r : records) {
    for (size_t i = 0; i < windows.size(); ++i) {
      if (r.start >= windows[i].begin && r.start <= windows[i].end) {
        steps[i].push_back(r);
        break;
      }
    }
  }
  for (auto& s : steps) {
    std::stable_sort(s.begin(), s.end(), [](const Record& a, const Record& b) {
      return a.start != b.start ? a.start < b.start : a.end < b.end;
    });
  }
  return steps;
}

StepAnalysis AnalyzeStep(const std::vector<Record>& recs, const std::vector<Edge>& edges) {
  StepAnalysis a;
  const size_t n = recs.size();
  if (n == 0) return a;
  a.first_start = recs[0].start;
  a.last_end = recs[0].end;
  for (const Record& r : recs) {
    a.first_start = std::min(a.first_start, r.start);
    a.last_end = std::max(a.last_end, r.end);
  }
  a.wall_ns = static_cast<int64_t>(a.last_end - a.first_start);

  // Union of busy intervals (records sorted by start): every record, then kernels alone.
  auto union_ns = [&](bool kernels_only) {
    int64_t total = 0;
    bool open = false;
    uint64_t cur_s = 0, cur_e = 0;
    for (const Record& r : recs) {
      if (kernels_only && r.kind != Kind::kKernel) continue;
      if (!open || r.start > cur_e) {
        if (open) total += static_cast<int64_t>(cur_e - cur_s);
        cur_s = r.start;
        cur_e = r.end;
        open = true;
      } else {
        cur_e = std::max(cur_e, r.end);
      }
    }
    if (open) total += static_cast<int64_t>(cur_e - cur_s);
    return total;
  };
  a.union_busy_ns = union_ns(false);
  a.idle_ns = a.wall_ns - a.union_busy_ns;
  a.no_kernel_ns = a.wall_ns - union_ns(true);

  // Streams, and each record's previous record on its stream (start order).
  std::map<uint32_t, StreamStat> streams;
  std::vector<long> stream_prev(n, -1);
  {
    std::unordered_map<uint32_t, size_t> last;
    for (size_t i = 0; i < n; ++i) {
      StreamStat& s = streams[recs[i].stream];
      s.stream = recs[i].stream;
      ++s.records;
      s.busy_ns += Dur(recs[i]);
      if (auto it = last.find(recs[i].stream); it != last.end()) stream_prev[i] = static_cast<long>(it->second);
      last[recs[i].stream] = i;
    }
  }
  for (const auto& [id, s] : streams) a.streams.push_back(s);
  std::stable_sort(a.streams.begin(), a.streams.end(),
                   [](const StreamStat& x, const StreamStat& y) { return x.records > y.records; });
  a.main_stream = a.streams[0].stream;
  a.main_busy_ns = a.streams[0].busy_ns;
  // Same-stream gaps; a side stream's are mostly waits for its next fork, so they are kept apart.
  for (size_t i = 0; i < n; ++i) {
    if (stream_prev[i] < 0) continue;
    const Record& p = recs[static_cast<size_t>(stream_prev[i])];
    const std::string key = (recs[i].stream == a.main_stream ? "" : "[side] ") + Pair(p, recs[i]);
    a.stream_gaps[key].Add(static_cast<int64_t>(recs[i].start) - static_cast<int64_t>(p.end));
  }

  // Graph producers of each record: edges into its node, followed through nodes that left no
  // record in this step (empty nodes, event nodes) to their own producers.
  std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, bool>>> into;  // node -> (producer, pdl)
  for (const Edge& e : edges) into[e.to].push_back({e.from, e.programmatic});
  std::unordered_map<uint64_t, size_t> node_record;
  for (size_t i = 0; i < n; ++i) {
    if (recs[i].graph_node != 0) node_record[recs[i].graph_node] = i;
  }
  auto producers = [&](size_t i) {
    std::vector<std::pair<size_t, bool>> out;  // (record, programmatic)
    std::set<uint64_t> seen;
    std::function<void(uint64_t)> walk = [&](uint64_t node) {
      auto it = into.find(node);
      if (it == into.end()) return;
      for (const auto& [from, pdl] : it->second) {
        if (!seen.insert(from).second) continue;
        auto r = node_record.find(from);
        if (r != node_record.end() && r->second != i) {
          out.push_back({r->second, pdl && node == recs[i].graph_node});
        } else if (r == node_record.end()) {
          walk(from);
        }
      }
    };
    if (recs[i].graph_node != 0) walk(recs[i].graph_node);
    return out;
  };

  // Each record's binding predecessor.
  std::vector<long> bind(n, -1);
  std::vector<LinkCause> cause(n, LinkCause::kFirst);
  for (size_t i = 0; i < n; ++i) {
    const Record& r = recs[i];
    const auto prods = producers(i);
    if (!prods.empty()) {
      ++a.edges_used;
      size_t best = prods[0].first;
      bool best_pdl = prods[0].second;
      for (const auto& [p, pdl] : prods) {
        if (recs[p].stream != r.stream) {
          a.join_gaps[Pair(recs[p], r)].Add(static_cast<int64_t>(r.start) - static_cast<int64_t>(recs[p].end));
        }
        if (recs[p].end > recs[best].end) {
          best = p;
          best_pdl = pdl;
        }
      }
      bind[i] = static_cast<long>(best);
      cause[i] = best_pdl ? LinkCause::kProgrammaticEdge : LinkCause::kEdge;
      continue;
    }
    // No graph producers: the stream's previous record, unless a record of another stream ended
    // after it and before this one started (then this one most likely waited for that: a join).
    const long p = stream_prev[i];
    long q = -1;
    for (size_t j = 0; j < n && recs[j].start <= r.start; ++j) {
      if (j == i || recs[j].stream == r.stream || recs[j].end > r.start) continue;
      if (q < 0 || recs[j].end > recs[static_cast<size_t>(q)].end) q = static_cast<long>(j);
    }
    if (q >= 0 && (p < 0 || recs[static_cast<size_t>(q)].end > recs[static_cast<size_t>(p)].end)) {
      bind[i] = q;
      cause[i] = LinkCause::kInferredJoin;
      const Record& qr = recs[static_cast<size_t>(q)];
      a.join_gaps[Pair(qr, r)].Add(static_cast<int64_t>(r.start) - static_cast<int64_t>(qr.end));
    } else if (p >= 0) {
      bind[i] = p;
      cause[i] = LinkCause::kStream;
    }
  }

  // The critical path: back from the last record to end (the later start on a tie).
  size_t last = 0;
  for (size_t i = 1; i < n; ++i) {
    if (recs[i].end > recs[last].end || (recs[i].end == recs[last].end && recs[i].start >= recs[last].start)) last = i;
  }
  std::vector<size_t> back;
  std::vector<bool> on(n, false);
  for (long i = static_cast<long>(last); i >= 0 && !on[static_cast<size_t>(i)]; i = bind[static_cast<size_t>(i)]) {
    on[static_cast<size_t>(i)] = true;
    back.push_back(static_cast<size_t>(i));
  }
  std::reverse(back.begin(), back.end());
  for (size_t k = 0; k < back.size(); ++k) {
    const Record& r = recs[back[k]];
    PathStep ps;
    ps.record = back[k];
    ps.cause = k == 0 ? LinkCause::kFirst : cause[back[k]];
    a.path_busy_ns += Dur(r);
    a.path_kernels[r.short_name].Add(Dur(r));
    if (k > 0) {
      const Record& p = recs[back[k - 1]];
      ps.gap_ns = static_cast<int64_t>(r.start) - static_cast<int64_t>(p.end);
      (ps.gap_ns >= 0 ? a.path_gap_ns : a.path_overlap_ns) += ps.gap_ns;
      a.path_gaps[Pair(p, r) + " [" + LinkCauseName(ps.cause) + "]"].Add(ps.gap_ns);
    }
    a.path.push_back(ps);
  }
  return a;
}

Layers FindLayers(const std::vector<Record>& recs, int n_layers) {
  Layers l;
  std::map<std::string, int> count;
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < recs.size(); ++i) {
    if (recs[i].kind != Kind::kKernel) continue;
    first.emplace(recs[i].short_name, l.kernel_index.size());
    ++count[recs[i].short_name];
    l.kernel_index.push_back(i);
  }
  size_t best = SIZE_MAX;
  for (const auto& [name, c] : count) {
    if (c == n_layers && first[name] < best) {
      best = first[name];
      l.marker = name;
    }
  }
  if (l.marker.empty()) return l;
  for (size_t k = 0; k < l.kernel_index.size(); ++k) {
    if (recs[l.kernel_index[k]].short_name == l.marker) l.segment_start.push_back(k);
  }
  // Group by the multiset of names each segment launches.
  std::map<std::vector<std::string>, size_t> by_signature;
  for (size_t s = 0; s < l.segment_start.size(); ++s) {
    const size_t end = s + 1 < l.segment_start.size() ? l.segment_start[s + 1] : l.kernel_index.size();
    std::vector<std::string> sig;
    for (size_t k = l.segment_start[s]; k < end; ++k) sig.push_back(recs[l.kernel_index[k]].short_name);
    std::sort(sig.begin(), sig.end());
    auto [it, added] = by_signature.emplace(sig, l.kinds.size());
    if (added) {
      LayerKind kind;
      bool gdn = false, attn = false;
      for (const std::string& name : sig) {
        std::string lower;
        for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        gdn = gdn || lower.find("gdn") != std::string::npos || lower.find("deltanet") != std::string::npos;
        attn = attn || lower.find("attention") != std::string::npos || lower.find("attn") != std::string::npos;
      }
      kind.label = gdn ? "gdn" : attn ? "attention" : "other";
      l.kinds.push_back(kind);
    }
    l.kinds[it->second].segments.push_back(s);
  }
  for (LayerKind& k : l.kinds) k.representative = k.segments[k.segments.size() / 2];
  std::stable_sort(l.kinds.begin(), l.kinds.end(),
                   [](const LayerKind& a, const LayerKind& b) { return a.segments.size() > b.segments.size(); });
  return l;
}

std::string LayerTable(const std::vector<Record>& recs, const Layers& l, const LayerKind& kind) {
  const size_t s = kind.representative;
  const size_t begin = l.segment_start[s];
  const size_t end = s + 1 < l.segment_start.size() ? l.segment_start[s + 1] : l.kernel_index.size();
  const uint64_t t0 = recs[l.kernel_index[begin]].start;
  uint64_t t1 = t0;
  for (size_t k = begin; k < end; ++k) t1 = std::max(t1, recs[l.kernel_index[k]].end);
  char head[160];
  snprintf(head, sizeof(head),
           "  layer kind %s: %zu layers like it; layer #%zu shown, %.2f us first start to last end\n",
           kind.label.c_str(), kind.segments.size(), s, 1e-3 * static_cast<double>(t1 - t0));
  std::string out = head;
  out += "    offset us    dur us  stream  kernel\n";
  for (size_t k = begin; k < end; ++k) {
    const Record& r = recs[l.kernel_index[k]];
    char line[400];
    snprintf(line, sizeof(line), "    %9.2f %9.2f  %6u  %s\n", 1e-3 * static_cast<double>(r.start - t0), 1e-3 * Dur(r),
             r.stream, r.short_name.c_str());
    out += line;
  }
  return out;
}

std::string Summary(const std::vector<StepAnalysis>& steps, const std::vector<std::vector<Record>>& recs, int top) {
  std::string out;
  const int n = static_cast<int>(steps.size());
  if (n == 0) return "no steps\n";
  out +=
      "  step   records  wall us  busy us  idle us  no-kernel us  main-stream busy us  path busy us  path gaps us  "
      "path overlaps us  path len\n";
  double sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    const StepAnalysis& a = steps[static_cast<size_t>(i)];
    char line[256];
    snprintf(line, sizeof(line), "  %4d %9zu %8.1f %8.1f %8.1f %13.1f %20.1f %13.1f %13.1f %17.1f %9zu\n", i,
             recs[static_cast<size_t>(i)].size(), 1e-3 * a.wall_ns, 1e-3 * a.union_busy_ns, 1e-3 * a.idle_ns,
             1e-3 * a.no_kernel_ns, 1e-3 * a.main_busy_ns, 1e-3 * a.path_busy_ns, 1e-3 * a.path_gap_ns,
             1e-3 * a.path_overlap_ns, a.path.size());
    out += line;
    const double v[8] = {1e-3 * a.wall_ns,      1e-3 * a.union_busy_ns, 1e-3 * a.idle_ns,     1e-3 * a.no_kernel_ns,
                         1e-3 * a.main_busy_ns, 1e-3 * a.path_busy_ns,  1e-3 * a.path_gap_ns, 1e-3 * a.path_overlap_ns};
    for (int k = 0; k < 8; ++k) sum[k] += v[k];
  }
  char mean[256];
  snprintf(mean, sizeof(mean), "  mean %9s %8.1f %8.1f %8.1f %13.1f %20.1f %13.1f %13.1f %17.1f\n", "", sum[0] / n,
           sum[1] / n, sum[2] / n, sum[3] / n, sum[4] / n, sum[5] / n, sum[6] / n, sum[7] / n);
  out += mean;
  const StepAnalysis& a0 = steps[0];
  out += "  streams (step 0): ";
  for (const StreamStat& s : a0.streams) {
    char b[96];
    snprintf(b, sizeof(b), "[%u: %lld records, %.1f us]%s ", s.stream, static_cast<long long>(s.records),
             1e-3 * s.busy_ns, s.stream == a0.main_stream ? " main" : "");
    out += b;
  }
  out += "\n  records with graph-edge producers (step 0): " + std::to_string(a0.edges_used) + "\n";
  StatMap kernels, path_gaps, stream_gaps, join_gaps;
  for (const StepAnalysis& a : steps) {
    Merge(kernels, a.path_kernels);
    Merge(path_gaps, a.path_gaps);
    Merge(stream_gaps, a.stream_gaps);
    Merge(join_gaps, a.join_gaps);
  }
  out += "critical path by kernel (per step):\n" + StatTable(kernels, n, top, "kernel");
  out += "critical path gaps by pair (per step; negative: overlap under PDL):\n" +
         StatTable(path_gaps, n, top, "producer -> consumer [link]");
  out += "same-stream gaps by pair (per step; [side]: not the main stream):\n" +
         StatTable(stream_gaps, n, top, "previous -> next");
  out += "cross-stream joins (producer end to consumer start, per step):\n" +
         StatTable(join_gaps, n, top, "producer -> consumer");
  return out;
}

}  // namespace tandem::timeline
