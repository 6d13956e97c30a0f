#include "gpu_service/metrics/metrics_registry.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace tandem {
namespace {

std::string FormatNumber(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.9g", v);
}

std::string RenderLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string escaped = absl::StrReplaceAll(
        labels[i].second, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
    absl::StrAppend(&out, i ? "," : "", labels[i].first, "=\"", escaped, "\"");
  }
  return out + "}";
}

// Adds one label to a rendered label set.
std::string WithLabel(const std::string& labels, const std::string& extra) {
  if (labels.empty()) return absl::StrCat("{", extra, "}");
  return absl::StrCat(labels.substr(0, labels.size() - 1), ",", extra, "}");
}

}  // namespace

uint64_t MetricValue::Encode(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

double MetricValue::Decode(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

void MetricValue::Add(double v) {
  uint64_t old = bits_.load(std::memory_order_relaxed);
  while (!bits_.compare_exchange_weak(old, Encode(Decode(old) + v), std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.Add(v);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(const std::string& name, const char* type,
                                                    const std::string& help) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.type = type;
    f.help = help;
  }
  return f;
}

MetricValue* MetricsRegistry::Counter(const std::string& name, const std::string& help,
                                      const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = GetFamily(name, "counter", help);
  f.series.push_back(Series{RenderLabels(labels), std::make_unique<MetricValue>(), nullptr});
  return f.series.back().value.get();
}

MetricValue* MetricsRegistry::Gauge(const std::string& name, const std::string& help,
                                    const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = GetFamily(name, "gauge", help);
  f.series.push_back(Series{RenderLabels(labels), std::make_unique<MetricValue>(), nullptr});
  return f.series.back().value.get();
}

Histogram* MetricsRegistry::AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = GetFamily(name, "histogram", help);
  f.series.push_back(Series{"", nullptr, std::make_unique<Histogram>(std::move(bounds))});
  return f.series.back().histogram.get();
}

void MetricsRegistry::AddCollector(std::function<void()> collector) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& c : collectors_) c();
  std::string out;
  for (const auto& [name, f] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", f.help, "\n# TYPE ", name, " ", f.type, "\n");
    for (const Series& s : f.series) {
      if (s.value) {
        absl::StrAppend(&out, name, s.labels, " ", FormatNumber(s.value->value()), "\n");
        continue;
      }
      const std::vector<uint64_t> counts = s.histogram->CumulativeCounts();
      const std::vector<double>& bounds = s.histogram->bounds();
      for (size_t i = 0; i <= bounds.size(); ++i) {
        const std::string le = i < bounds.size() ? FormatNumber(bounds[i]) : "+Inf";
        absl::StrAppend(&out, name, "_bucket", WithLabel(s.labels, absl::StrCat("le=\"", le, "\"")),
                        " ", counts[i], "\n");
      }
      absl::StrAppend(&out, name, "_sum", s.labels, " ", FormatNumber(s.histogram->sum()), "\n");
      absl::StrAppend(&out, name, "_count", s.labels, " ", counts.back(), "\n");
    }
  }
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
          0.75,  1.0,    2.5,   5.0,  10.0,  20.0, 30.0,  60.0};
}

}  // namespace tandem
