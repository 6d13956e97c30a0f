// The service's metrics, named in vLLM's style with a `tandem:` prefix:
//   tandem:time_to_first_token_seconds      histogram  arrival -> first generated token
//   tandem:time_per_output_token_seconds    histogram  between consecutive generated tokens
//   tandem:e2e_request_latency_seconds      histogram  arrival -> last update
//   tandem:request_queue_time_seconds       histogram  arrival -> admission to the running set
//   tandem:prompt_tokens_total              counter
//   tandem:generation_tokens_total          counter
//   tandem:request_success_total{finished_reason}   counter, one series per stop reason
//   tandem:request_rejected_total{reason}   counter  (queue_full, draining)
//   tandem:num_requests_running / _waiting  gauges
//   tandem:state_pool_pages_in_use / tandem:state_pool_pages_max   gauges (from the backend)
//   tandem:expert_rows_total{placement="local"|"worker"}           counter (from the backend)
//   tandem:expert_admissions_total, tandem:expert_evictions_total  counters
//   tandem:expert_bytes_moved_total{direction="to_workers"|"from_workers"|"admitted"}
//   tandem:worker_seconds_total             counter  time spent waiting for host workers
#ifndef TANDEM_GPU_SERVICE_METRICS_SERVICE_METRICS_H_
#define TANDEM_GPU_SERVICE_METRICS_SERVICE_METRICS_H_

#include <map>
#include <string>

#include "gpu_service/backend/backend.h"
#include "gpu_service/metrics/metrics_registry.h"

namespace tandem {

class ServiceMetrics {
 public:
  // Registers every metric in `registry` (which must outlive this). With a backend, the state
  // pool and expert placement metrics are read from it at each scrape.
  ServiceMetrics(MetricsRegistry* registry, const Backend* backend);

  Histogram* time_to_first_token;
  Histogram* time_per_output_token;
  Histogram* e2e_latency;
  Histogram* queue_time;
  MetricValue* prompt_tokens;
  MetricValue* generation_tokens;
  MetricValue* running;
  MetricValue* waiting;
  MetricValue* rejected_queue_full;
  MetricValue* rejected_draining;
  // `reason`: "max_tokens", "eos_token", "stop_sequence", "time_limit", "cancelled",
  // "token_limit" or "error".
  MetricValue* finished(const std::string& reason);

 private:
  std::map<std::string, MetricValue*> finished_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_METRICS_SERVICE_METRICS_H_
