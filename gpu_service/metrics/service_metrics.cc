#include "gpu_service/metrics/service_metrics.h"

namespace tandem {

ServiceMetrics::ServiceMetrics(MetricsRegistry* r, const Backend* backend) {
  time_to_first_token = r->AddHistogram("tandem:time_to_first_token_seconds",
                                        "Time from arrival to the first generated token.",
                                        LatencyBuckets());
  time_per_output_token = r->AddHistogram("tandem:time_per_output_token_seconds",
                                          "Time between consecutive generated tokens.",
                                          LatencyBuckets());
  e2e_latency = r->AddHistogram("tandem:e2e_request_latency_seconds",
                                "Time from arrival to the request's end.", LatencyBuckets());
  queue_time = r->AddHistogram("tandem:request_queue_time_seconds",
                               "Time from arrival to joining the running set.", LatencyBuckets());
  prompt_tokens = r->Counter("tandem:prompt_tokens_total", "Prompt tokens of admitted requests.");
  generation_tokens = r->Counter("tandem:generation_tokens_total", "Generated tokens.");
  running = r->Gauge("tandem:num_requests_running", "Requests in the running set.");
  waiting = r->Gauge("tandem:num_requests_waiting", "Requests waiting in the queue.");
  rejected_queue_full = r->Counter("tandem:request_rejected_total",
                                   "Requests refused before queueing.", {{"reason", "queue_full"}});
  rejected_draining = r->Counter("tandem:request_rejected_total",
                                 "Requests refused before queueing.", {{"reason", "draining"}});
  for (const char* reason : {"max_tokens", "eos_token", "stop_sequence", "time_limit", "cancelled",
                             "token_limit", "error"}) {
    finished_[reason] = r->Counter("tandem:request_success_total",
                                   "Finished requests by stop reason.",
                                   {{"finished_reason", reason}});
  }
  if (backend == nullptr) return;
  MetricValue* pages = r->Gauge("tandem:state_pool_pages_in_use",
                                "Pages of per-sequence state in use.");
  MetricValue* max_pages = r->Gauge("tandem:state_pool_pages_max",
                                    "Page limit of the state pool (0: unbounded).");
  const char* rows_help = "Routed-expert rows computed, by where they ran.";
  MetricValue* local_rows = r->Counter("tandem:expert_rows_total", rows_help,
                                       {{"placement", "local"}});
  MetricValue* worker_rows = r->Counter("tandem:expert_rows_total", rows_help,
                                        {{"placement", "worker"}});
  MetricValue* admissions = r->Counter("tandem:expert_admissions_total",
                                       "Experts admitted into the local expert cache.");
  MetricValue* evictions = r->Counter("tandem:expert_evictions_total",
                                      "Experts evicted from the local expert cache.");
  const char* bytes_help = "Bytes moved for routed experts.";
  MetricValue* to_workers = r->Counter("tandem:expert_bytes_moved_total", bytes_help,
                                       {{"direction", "to_workers"}});
  MetricValue* from_workers = r->Counter("tandem:expert_bytes_moved_total", bytes_help,
                                         {{"direction", "from_workers"}});
  MetricValue* admitted = r->Counter("tandem:expert_bytes_moved_total", bytes_help,
                                     {{"direction", "admitted"}});
  MetricValue* worker_seconds = r->Counter("tandem:worker_seconds_total",
                                           "Time spent waiting for host workers.");
  r->AddCollector([=] {
    const StateUsage usage = backend->state_usage();
    pages->Set(static_cast<double>(usage.pages_in_use));
    max_pages->Set(static_cast<double>(usage.max_pages));
    const ExpertPlacementTotals t = backend->placement();
    local_rows->Set(static_cast<double>(t.local_rows));
    worker_rows->Set(static_cast<double>(t.worker_rows));
    admissions->Set(static_cast<double>(t.admissions));
    evictions->Set(static_cast<double>(t.evictions));
    to_workers->Set(static_cast<double>(t.bytes_to_workers));
    from_workers->Set(static_cast<double>(t.bytes_from_workers));
    admitted->Set(static_cast<double>(t.bytes_admitted));
    worker_seconds->Set(t.worker_seconds);
  });
}

MetricValue* ServiceMetrics::finished(const std::string& reason) {
  auto it = finished_.find(reason);
  return it == finished_.end() ? finished_.at("error") : it->second;
}

}  // namespace tandem
