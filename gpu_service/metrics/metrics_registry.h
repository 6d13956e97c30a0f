// A small Prometheus metrics registry: counters, gauges and histograms (with optional constant
// labels), rendered in the text exposition format (version 0.0.4).
//
// Why not a library: Debian 12 packages no C++ Prometheus client (prometheus-cpp is not in
// bookworm), and the format is a few lines of text; this keeps the dependency list to what apt
// has.
//
// Metrics are created once at start (registration is not meant for hot paths) and live as long as
// the registry; updating them is lock-free and safe from any thread. Collectors run at the start
// of every Render, to copy values kept elsewhere (the backend's totals) into metrics.
#ifndef TANDEM_GPU_SERVICE_METRICS_METRICS_REGISTRY_H_
#define TANDEM_GPU_SERVICE_METRICS_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A counter or a gauge: one double.
class MetricValue {
 public:
  void Add(double v);
  void Set(double v) { bits_.store(Encode(v), std::memory_order_relaxed); }
  double value() const { return Decode(bits_.load(std::memory_order_relaxed)); }

 private:
  static uint64_t Encode(double v);
  static double Decode(uint64_t b);
  std::atomic<uint64_t> bits_{0};
};

class Histogram {
 public:
  // `bounds`: the upper bounds of the buckets, ascending (+Inf is implied).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then +Inf; and the sum.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.value(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (non-cumulative), then +Inf
  MetricValue sum_;
};

class MetricsRegistry {
 public:
  // Names may contain ':' (the `tandem:` prefix, as vLLM's `vllm:`). One name, one type; several
  // label sets of one name form one family (the help of the first registration is kept).
  MetricValue* Counter(const std::string& name, const std::string& help,
                       const MetricLabels& labels = {});
  MetricValue* Gauge(const std::string& name, const std::string& help,
                     const MetricLabels& labels = {});
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);
  void AddCollector(std::function<void()> collector);

  // The text exposition of every metric, families in name order.
  std::string Render() const;

 private:
  struct Series {
    std::string labels;  // rendered: {a="b",c="d"} or empty
    std::unique_ptr<MetricValue> value;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string type, help;
    std::vector<Series> series;
  };
  Family& GetFamily(const std::string& name, const char* type, const std::string& help);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  std::vector<std::function<void()>> collectors_;
};

// Bucket bounds for latencies in seconds, 1 ms .. 60 s.
std::vector<double> LatencyBuckets();

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_METRICS_METRICS_REGISTRY_H_
