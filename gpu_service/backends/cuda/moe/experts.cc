#include "gpu_service/backends/cuda/moe/experts.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/matvec.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

absl::StatusOr<MoeStepPlan> PlanMoeStep(std::span<const int32_t> experts, int64_t n, int64_t K, int64_t E,
                                        absl::FunctionRef<std::optional<ExpertLocation>(int32_t)> locate) {
  if (static_cast<int64_t>(experts.size()) != n * K) {
    return absl::InvalidArgumentError(absl::StrCat("PlanMoeStep: ", experts.size(), " picks, expected n·K = ", n * K));
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    if (experts[i] < 0 || experts[i] >= E) {
      return absl::InvalidArgumentError(absl::StrCat("PlanMoeStep: pick ", i, " is expert ", experts[i],
                                                     ", outside [0, ", E, ")"));
    }
  }
  // Pairs grouped by expert, in pair order within an expert: a counting sort (prefill steps have
  // tens of thousands of pairs over a few hundred experts; a comparison sort cost milliseconds).
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0);
  for (int32_t e : experts) ++start[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(experts.size());
  for (size_t p = 0; p < experts.size(); ++p) order[static_cast<size_t>(start[experts[p]]++)] = static_cast<int64_t>(p);

  MoeStepPlan plan;
  plan.slot.assign(experts.size(), -1);
  plan.units.reserve(experts.size() / kMaxUnitRows + static_cast<size_t>(E));
  std::vector<int64_t> host_pairs;
  size_t i = 0;
  while (i < order.size()) {
    size_t j = i;
    const int32_t e = experts[order[i]];
    while (j < order.size() && experts[order[j]] == e) ++j;
    const std::optional<ExpertLocation> where = locate(e);
    if (!where.has_value()) {
      host_pairs.insert(host_pairs.end(), order.begin() + static_cast<int64_t>(i), order.begin() + static_cast<int64_t>(j));
      i = j;
      continue;
    }
    for (size_t u0 = i; u0 < j; u0 += kMaxUnitRows) {
      ExpertUnit unit{};
      unit.gate = where->gate;
      unit.up = where->up;
      unit.down = where->down;
      unit.rows = static_cast<int32_t>(std::min<size_t>(kMaxUnitRows, j - u0));
      unit.first_slot = plan.gpu_slots;
      for (int r = 0; r < unit.rows; ++r) {
        const int64_t pair = order[u0 + r];
        unit.input_row[r] = static_cast<int32_t>(pair / K);
        plan.slot[pair] = plan.gpu_slots++;
      }
      plan.max_unit_rows = std::max(plan.max_unit_rows, unit.rows);
      plan.units.push_back(unit);
    }
    i = j;
  }
  plan.total_slots = plan.gpu_slots;
  for (int64_t pair : host_pairs) {
    plan.offloaded.push_back(OffloadedPair{experts[pair], static_cast<int32_t>(pair / K), plan.total_slots});
    plan.slot[pair] = plan.total_slots++;
  }
  return plan;
}

std::vector<ExpertUnit> DenseExpertUnits(const ExpertLocation& where, int64_t n, int32_t first_slot) {
  std::vector<ExpertUnit> units;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxUnitRows) {
    ExpertUnit u{};
    u.gate = where.gate;
    u.up = where.up;
    u.down = where.down;
    u.rows = static_cast<int32_t>(std::min<int64_t>(kMaxUnitRows, n - t0));
    u.first_slot = first_slot + static_cast<int32_t>(t0);
    for (int r = 0; r < u.rows; ++r) u.input_row[r] = static_cast<int32_t>(t0 + r);
    units.push_back(u);
  }
  return units;
}

absl::StatusOr<ExpertDecodeRunner> ExpertDecodeRunner::Create(int64_t max_units) {
  if (max_units < 1) return absl::InvalidArgumentError(absl::StrCat("ExpertDecodeRunner: max_units=", max_units));
  ExpertDecodeRunner r;
  r.max_units_ = max_units;
  const size_t bytes = static_cast<size_t>(max_units) * sizeof(ExpertUnit);
  absl::StatusOr<PinnedBuffer> p = PinnedBuffer::Allocate(bytes);
  if (!p.ok()) return p.status();
  r.staging_ = *std::move(p);
  absl::StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(bytes);
  if (!d.ok()) return d.status();
  r.device_units_ = *std::move(d);
  absl::StatusOr<Event> e = Event::Create(/*timing=*/false);
  if (!e.ok()) return e.status();
  r.staged_ = *std::move(e);
  return r;
}

namespace {

absl::Status CheckShapeTypes(const ExpertDecodeRunner::Shape& shape) {
  const uint32_t gu_type = static_cast<uint32_t>(shape.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape.down_type);
  if (!MoeKernelsSupportType(gu_type) || !MoeKernelsSupportType(d_type)) {
    return absl::InvalidArgumentError(absl::StrCat("expert weight types gate/up=", gu_type, " down=", d_type,
                                                   ": no GPU decode kernel"));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitMatrix(const void* m, uint32_t type, const char* name, size_t unit) {
  if (m == nullptr) return absl::InvalidArgumentError(absl::StrCat("expert unit ", unit, ": ", name, " is null"));
  if (reinterpret_cast<uintptr_t>(m) % KernelRowAlignment(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert unit ", unit, ": ", name, " address is not ",
                                                   KernelRowAlignment(type), "-byte aligned"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExpertDecodeRunner::Run(std::span<const ExpertUnit> units, const Shape& shape, const float* x,
                                     float* act, float* partial, cudaStream_t stream) {
  if (units.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(units.size()) > max_units_) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertDecodeRunner: ", units.size(), " units, capacity ", max_units_));
  }
  const uint32_t gu_type = static_cast<uint32_t>(shape.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape.down_type);
  if (absl::Status s = CheckShapeTypes(shape); !s.ok()) return s;
  int max_rows = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const ExpertUnit& u = units[i];
    if (u.rows < 1 || u.rows > kMaxUnitRows) {
      return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": rows=", u.rows, " outside [1, ", kMaxUnitRows, "]"));
    }
    if (absl::Status s = CheckUnitMatrix(u.gate, gu_type, "gate", i); !s.ok()) return s;
    if (absl::Status s = CheckUnitMatrix(u.up, gu_type, "up", i); !s.ok()) return s;
    if (absl::Status s = CheckUnitMatrix(u.down, d_type, "down", i); !s.ok()) return s;
    max_rows = std::max(max_rows, u.rows);
  }
  // The previous upload must have left the staging buffer before it is overwritten.
  if (pending_) TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_.get()));
  std::memcpy(staging_.get(), units.data(), units.size() * sizeof(ExpertUnit));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_units_.get(), staging_.get(), units.size() * sizeof(ExpertUnit),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.get(), stream));
  pending_ = true;
  return LaunchUnits(device_units_.as<ExpertUnit>(), static_cast<int>(units.size()), nullptr, max_rows, shape, x, act,
                     partial, stream);
}

absl::Status ExpertDecodeRunner::RunPlanned(const ExpertUnit* device_units, int max_units, const int* device_count,
                                            int max_rows, const Shape& shape, const float* x, float* act,
                                            float* partial, cudaStream_t stream) {
  if (max_units < 1) return absl::OkStatus();
  if (max_rows < 1 || max_rows > kMaxUnitRows) {
    return absl::InvalidArgumentError(absl::StrCat("planned expert units: max_rows=", max_rows, " outside [1, ",
                                                   kMaxUnitRows, "]"));
  }
  if (absl::Status s = CheckShapeTypes(shape); !s.ok()) return s;
  return LaunchUnits(device_units, max_units, device_count, max_rows, shape, x, act, partial, stream);
}

absl::Status ExpertDecodeRunner::LaunchUnits(const ExpertUnit* dev, int count, const int* device_count, int max_rows,
                                             const Shape& shape, const float* x, float* act, float* partial,
                                             cudaStream_t stream) {
  const uint32_t gu_type = static_cast<uint32_t>(shape.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape.down_type);
  cudaError_t err = LaunchExpertGateUp(gu_type, dev, count, max_rows, static_cast<int>(shape.h),
                                       static_cast<int>(shape.inner), x, act, stream, device_count);
  if (err == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(absl::StrCat("expert gate/up {", shape.h, ", ", shape.inner, "} of type ", gu_type,
                                                   " is refused by the decode kernel"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(err);
  err = LaunchExpertDown(d_type, dev, count, max_rows, static_cast<int>(shape.inner), static_cast<int>(shape.h), act,
                         partial, stream, device_count);
  if (err == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(absl::StrCat("expert down {", shape.inner, ", ", shape.h, "} of type ", d_type,
                                                   " is refused by the decode kernel"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

}  // namespace tandem::cuda
