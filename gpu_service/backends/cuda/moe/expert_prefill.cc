#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

absl::Status BlasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", what, ": ", cublasGetStatusName(s), ": ",
                                          cublasGetStatusString(s)));
}

absl::Status Alloc(DeviceBuffer& b, size_t bytes) {
  absl::StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(bytes);
  if (!d.ok()) return d.status();
  b = *std::move(d);
  return absl::OkStatus();
}

// Tiles start at this byte offset of the index upload (16-byte aligned after max_slots int32s).
size_t TileOffset(int64_t max_slots) { return (static_cast<size_t>(max_slots) * sizeof(int32_t) + 15) / 16 * 16; }

bool ValidTileRows(int rows) {
  return std::find(std::begin(kPrefillTileRows), std::end(kPrefillTileRows), rows) != std::end(kPrefillTileRows);
}

}  // namespace

StreamedOrder DefaultStreamedOrder() { return StreamedOrder::kDynamic; }

StreamedSchedule ExpertPrefillRunner::Schedule(bool down) const {
  StreamedSchedule s;
  s.order = options_.work_order.value_or(DefaultStreamedOrder());
  // Separate counters for gate/up and down, although stream order alone would let them share one.
  if (work_counters_.get() != nullptr) s.counter = work_counters_.as<int>() + (down ? 2 : 0);
  // No counter (the streamed kernels cannot run on this runner): kStrided rather than a refusal.
  if (s.order == StreamedOrder::kDynamic && s.counter == nullptr) s.order = StreamedOrder::kStrided;
  return s;
}

struct ExpertPrefillRunner::Blas {
  cublasHandle_t handle = nullptr;
  ~Blas() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

ExpertPrefillRunner::ExpertPrefillRunner(ExpertPrefillRunner&&) noexcept = default;
ExpertPrefillRunner& ExpertPrefillRunner::operator=(ExpertPrefillRunner&&) noexcept = default;
ExpertPrefillRunner::~ExpertPrefillRunner() = default;

absl::StatusOr<ExpertPrefillRunner> ExpertPrefillRunner::Create(const ExpertDecodeRunner::Shape& shape,
                                                                int64_t max_slots, const PrefillOptions& options) {
  if (max_slots < 1 || shape.h < 1 || shape.inner < 1 || options.max_input_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: h=", shape.h, " I=", shape.inner,
                                                   " max_slots=", max_slots, " max_input_rows=", options.max_input_rows));
  }
  const bool grouped = options.algorithm != PrefillAlgorithm::kCublasPerExpert;
  if (grouped) {
    if (options.tile_rows != 0 && !ValidTileRows(options.tile_rows)) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: tile_rows=", options.tile_rows,
                                                     " (16, 32, 64, 128 or 0)"));
    }
    if (options.streamed_kernel == PrefillKernel::kPipelined) {
      return absl::InvalidArgumentError("ExpertPrefillRunner: streamed_kernel must be a streamed variant");
    }
    if (IsMmqKernel(options.streamed_kernel) && options.tile_rows > kMmqMaxTileRows) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: kMmq takes tile_rows 0, 16 or 32, not ",
                                                     options.tile_rows));
    }
    if (options.streamed_kernel == PrefillKernel::kStreamedRows && options.tile_rows > kStreamedRowsMaxTileRows) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: kStreamedRows takes tile_rows 0, 16 or 32, not ",
                                                     options.tile_rows));
    }
    const uint32_t gu = static_cast<uint32_t>(shape.gate_up_type), d = static_cast<uint32_t>(shape.down_type);
    if (KernelRowAlignment(gu) == 0 || KernelRowAlignment(d) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: gate/up type ", gu, " or down type ", d,
                                                     " has no GPU dequantizer"));
    }
    if (shape.h % 32 != 0 || shape.h % RowLengthMultiple(gu) != 0 || shape.inner % 32 != 0 ||
        shape.inner % RowLengthMultiple(d) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: h=", shape.h, " I=", shape.inner,
                                                     " must be multiples of 32 and of the types' blocks"));
    }
  }
  ExpertPrefillRunner r;
  r.shape_ = shape;
  r.max_slots_ = max_slots;
  r.options_ = options;
  if (r.options_.max_input_rows == 0) r.options_.max_input_rows = max_slots;
  const size_t h = static_cast<size_t>(shape.h), I = static_cast<size_t>(shape.inner), m = static_cast<size_t>(max_slots);
  if (absl::Status s = Alloc(r.act_, m * I * 2); !s.ok()) return s;
  // Grouped: at most one tile per slot (every tile holds at least one row).
  const size_t upload = grouped ? TileOffset(max_slots) + m * sizeof(PrefillTile) : m * 4;
  if (absl::Status s = Alloc(r.index_, upload); !s.ok()) return s;
  if (grouped) {
    if (absl::Status s = Alloc(r.x_f16_, static_cast<size_t>(r.options_.max_input_rows) * h * 2); !s.ok()) return s;
    const PrefillKernel k = options.streamed_kernel;
    if (options.algorithm == PrefillAlgorithm::kGroupedTiles && UsesMmqKernel(shape) &&
        (IsMmqKernel(k) || k == PrefillKernel::kStreamedAuto)) {
      const int hi = static_cast<int>(h), ii = static_cast<int>(I);
      if (absl::Status s = Alloc(r.mmq_x_, MmqActivationBytes(r.options_.max_input_rows, hi)); !s.ok()) return s;
      if (absl::Status s = Alloc(r.mmq_act_, m * I * 4); !s.ok()) return s;
      if (absl::Status s = Alloc(r.mmq_act_q_, MmqActivationBytes(max_slots, ii)); !s.ok()) return s;
      // Slots no unit covers are quantized too (and never read): zeros rather than stale bits.
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(r.mmq_act_.get(), 0, m * I * 4));
    }
    if (options.algorithm == PrefillAlgorithm::kGroupedTiles && UsesStreamedKernel(shape, options.tile_rows)) {
      if (absl::Status s = Alloc(r.device_plan_, (2 * m + 4) * sizeof(int32_t)); !s.ok()) return s;
      if (absl::Status s = Alloc(r.work_counters_, 4 * sizeof(int32_t)); !s.ok()) return s;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(r.work_counters_.get(), 0, 4 * sizeof(int32_t)));
    }
  } else {
    r.blas_ = std::make_unique<Blas>();
    if (absl::Status s = BlasStatus(cublasCreate(&r.blas_->handle), "cublasCreate"); !s.ok()) return s;
    if (absl::Status s = Alloc(r.w_gate_up_, 2 * I * h * 2); !s.ok()) return s;
    if (absl::Status s = Alloc(r.w_down_, h * I * 2); !s.ok()) return s;
    if (absl::Status s = Alloc(r.x_rows_, m * h * 2); !s.ok()) return s;
    if (absl::Status s = Alloc(r.gu_, m * 2 * I * 4); !s.ok()) return s;
  }
  absl::StatusOr<PinnedBuffer> p = PinnedBuffer::Allocate(upload);
  if (!p.ok()) return p.status();
  r.index_staging_ = *std::move(p);
  absl::StatusOr<Event> e = Event::Create(/*timing=*/false);
  if (!e.ok()) return e.status();
  r.staged_ = *std::move(e);
  return r;
}

absl::Status ExpertPrefillRunner::Run(std::span<const ExpertUnit> units, const float* x, float* partial,
                                      cudaStream_t stream) {
  if (units.empty()) return absl::OkStatus();
  if (options_.algorithm == PrefillAlgorithm::kCublasPerExpert) return RunCublas(units, x, partial, stream);
  return RunGrouped(units, x, partial, stream);
}

std::optional<DevicePrefillChoice> ExpertPrefillRunner::DevicePlannedChoice(int64_t slots, int64_t experts) const {
  if (device_plan_.get() == nullptr || slots < 1 || experts < 1) return std::nullopt;
  const PrefillKernel k = options_.streamed_kernel;
  const int t = options_.tile_rows;
  const bool lean_default =
      MmqAutoKernel() == PrefillKernel::kMmqLean || MmqAutoKernel() == PrefillKernel::kMmqLeanWarps8 ||
      MmqAutoKernel() == PrefillKernel::kMmqLean2;
  if (k == PrefillKernel::kStreamedAuto) {
    if (t != 0) return DevicePrefillChoice{PrefillKernel::kStreamed, t};
    if (slots <= kDeviceMmqMaxMeanRows * experts) {
      // Small groups: the host rule's lean kernel at 16-row tiles; another MMQ kernel or none (the
      // row-streamed kernel) needs the groups.
      if (mmq_x_.get() == nullptr || !lean_default) return std::nullopt;
      return DevicePrefillChoice{MmqAutoKernel(), 16};
    }
    // Large groups: the weights-as-A wgmma kernel (the host rule's ChooseWgmmaTile on the mean).
    if (WgmmaByDefault() && slots >= WgmmaMinMeanRows() * experts) {
      return DevicePrefillChoice{WgmmaAutoKernel(), kWgmmaMaxTileRows};
    }
    return DevicePrefillChoice{PrefillKernel::kStreamed, kStreamedMaxTileRows};
  }
  if (IsWgmmaKernel(k)) return DevicePrefillChoice{k, t == 0 ? kWgmmaMaxTileRows : t};
  if (k == PrefillKernel::kMmqLean || k == PrefillKernel::kMmqLeanWarps8 || k == PrefillKernel::kMmqLean2) {
    if (mmq_x_.get() == nullptr || t > 16) return std::nullopt;
    return DevicePrefillChoice{k, t == 0 ? 16 : t};
  }
  if (k == PrefillKernel::kStreamed || k == PrefillKernel::kStreamedL2Lines256 ||
      k == PrefillKernel::kStreamedUnitPrefetch) {
    return DevicePrefillChoice{k, t == 0 ? kStreamedMaxTileRows : t};
  }
  return std::nullopt;
}

absl::StatusOr<ExpertPrefillRunner::DeviceTiles> ExpertPrefillRunner::CheckDevicePlan(int max_units, int input_rows,
                                                                                      int slots, int64_t experts) {
  const std::optional<DevicePrefillChoice> choice = DevicePlannedChoice(slots, experts);
  if (!choice.has_value()) {
    return absl::FailedPreconditionError("ExpertPrefillRunner: this shape or kernel choice needs the host plan");
  }
  if (max_units < 1 || max_units > max_slots_ || input_rows < 1 || input_rows > options_.max_input_rows ||
      slots > max_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: device plan of ", max_units, " units, ",
                                                   input_rows, " input rows, ", slots, " slots; capacity ", max_slots_,
                                                   " slots, ", options_.max_input_rows, " input rows"));
  }
  DeviceTiles d;
  d.choice = *choice;
  // A group of r rows has ceil(r / T) <= (r - 1) / T + 1 tiles, so the call at most slots / T + groups, groups <= units.
  d.max_tiles = std::min(slots, slots / choice->tile_rows + max_units);
  d.tiles = reinterpret_cast<PrefillTile*>(index_.as<uint8_t>() + TileOffset(max_slots_));
  d.tile_count = device_plan_.as<int32_t>() + 2 * max_slots_;
  return d;
}

absl::Status ExpertPrefillRunner::DeviceTilesTarget(int max_units, int input_rows, int slots, int64_t experts,
                                                    int* error, DevicePrefillTilesArgs* target) {
  absl::StatusOr<DeviceTiles> d = CheckDevicePlan(max_units, input_rows, slots, experts);
  if (!d.ok()) return d.status();
  if (error == nullptr || target == nullptr) {
    return absl::InvalidArgumentError("ExpertPrefillRunner: device plan without an error flag or a target");
  }
  DevicePrefillTilesArgs b;
  b.max_units = max_units;
  b.tile_rows = d->choice.tile_rows;
  b.max_slots = slots;
  b.max_input_rows = input_rows;
  b.gate_up_align = KernelRowAlignment(static_cast<uint32_t>(shape_.gate_up_type));
  b.down_align = KernelRowAlignment(static_cast<uint32_t>(shape_.down_type));
  b.tiles = d->tiles;
  b.max_tiles = d->max_tiles;
  b.num_tiles = d->tile_count;
  b.index = index_.as<int32_t>();
  b.error = error;
  *target = b;
  last_tile_rows_ = d->choice.tile_rows;
  last_kernel_ = d->choice.kernel;
  return absl::OkStatus();
}

absl::Status ExpertPrefillRunner::RunDevicePlanned(const ExpertUnit* units, const int* num_units, int max_units,
                                                   int input_rows, int slots, int64_t experts, const float* x,
                                                   float* partial, int* error, cudaStream_t stream,
                                                   bool x_ready) {
  if (units == nullptr || num_units == nullptr) {
    return absl::InvalidArgumentError("ExpertPrefillRunner: device plan without units or unit count");
  }
  if (reinterpret_cast<uintptr_t>(partial) % 8 != 0) {
    return absl::InvalidArgumentError("ExpertPrefillRunner: partial is not 8-byte aligned");
  }
  DevicePrefillTilesArgs b;
  if (absl::Status s = DeviceTilesTarget(max_units, input_rows, slots, experts, error, &b); !s.ok()) return s;
  b.units = units;
  b.num_units = num_units;
  b.scratch = device_plan_.as<int32_t>();
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchBuildPrefillTiles(b, stream));
  return RunDeviceTiles(max_units, input_rows, slots, experts, x, partial, stream, x_ready);
}

std::optional<MmqActivations> ExpertPrefillRunner::MmqInputPlanes(int64_t input_rows, int64_t slots,
                                                                  int64_t experts) const {
  if (input_rows < 1 || input_rows > options_.max_input_rows || slots > max_slots_) return std::nullopt;
  const std::optional<DevicePrefillChoice> choice = DevicePlannedChoice(slots, experts);
  if (!choice.has_value() || !IsMmqKernel(choice->kernel) || mmq_x_.get() == nullptr) return std::nullopt;
  return MmqActivationPlanes(mmq_x_.get(), options_.max_input_rows, static_cast<int>(shape_.h));
}

uint16_t* ExpertPrefillRunner::StreamedF16Input(int64_t input_rows, int64_t slots, int64_t experts) const {
  if (input_rows < 1 || input_rows > options_.max_input_rows || slots > max_slots_) return nullptr;
  const std::optional<DevicePrefillChoice> choice = DevicePlannedChoice(slots, experts);
  // Every device-planned choice that is not an integer-MMA kernel is a streamed f16 kernel reading
  // x_f16_ (RunDeviceTiles).
  if (!choice.has_value() || IsMmqKernel(choice->kernel) || x_f16_.get() == nullptr) return nullptr;
  return x_f16_.as<uint16_t>();
}

absl::Status ExpertPrefillRunner::RunDeviceTiles(int max_units, int input_rows, int slots, int64_t experts,
                                                 const float* x, float* partial, cudaStream_t stream,
                                                 bool x_ready) {
  absl::StatusOr<DeviceTiles> d = CheckDevicePlan(max_units, input_rows, slots, experts);
  if (!d.ok()) return d.status();
  if (reinterpret_cast<uintptr_t>(partial) % 8 != 0) {
    return absl::InvalidArgumentError("ExpertPrefillRunner: partial is not 8-byte aligned");
  }
  const DevicePrefillChoice* choice = &d->choice;
  const int T = choice->tile_rows, max_tiles = d->max_tiles;
  const PrefillTile* tiles = d->tiles;
  const int* tile_count = d->tile_count;
  last_tile_rows_ = T;
  last_kernel_ = choice->kernel;
  const int h = static_cast<int>(shape_.h), I = static_cast<int>(shape_.inner);
  if (IsMmqKernel(choice->kernel)) {
    const MmqActivations xq = MmqActivationPlanes(mmq_x_.get(), options_.max_input_rows, h);
    const MmqActivations aq = MmqActivationPlanes(mmq_act_q_.get(), max_slots_, I);
    if (!x_ready) {
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqQuantize(x, input_rows, h, xq, stream));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqGateUp(choice->kernel, T, tiles, max_tiles, xq, index_.as<int32_t>(), h, I,
                                                mmq_act_.as<float>(), stream, tile_count));
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqQuantize(mmq_act_.as<float>(), slots, I, aq, stream));
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqDown(choice->kernel, T, tiles, max_tiles, aq, h, I, partial, stream, tile_count));
    return absl::OkStatus();
  }
  uint16_t* xb = x_f16_.as<uint16_t>();
  // x_ready: the stream norm wrote these rows (StreamedF16Input), the same bits.
  if (!x_ready) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchConvertToF16(x, static_cast<int64_t>(input_rows) * h, xb, stream));
  }
  uint16_t* act = act_.as<uint16_t>();
  const uint32_t gu_type = static_cast<uint32_t>(shape_.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape_.down_type);
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchPrefillGateUp(choice->kernel, gu_type, T, tiles, max_tiles, xb, index_.as<int32_t>(),
                                                  h, I, act, stream, tile_count, Schedule(false)));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchPrefillDown(choice->kernel, d_type, T, tiles, max_tiles, act, h, I, partial, stream,
                                                tile_count, Schedule(true)));
  return absl::OkStatus();
}

absl::Status ExpertPrefillRunner::RunGrouped(std::span<const ExpertUnit> units, const float* x, float* partial,
                                             cudaStream_t stream) {
  const uint32_t gu_type = static_cast<uint32_t>(shape_.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape_.down_type);
  const int gu_align = KernelRowAlignment(gu_type), d_align = KernelRowAlignment(d_type);
  int32_t slots = 0, input_rows = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const ExpertUnit& u = units[i];
    if (u.rows < 1 || u.rows > kMaxUnitRows || u.first_slot < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": rows=", u.rows, " first_slot=", u.first_slot));
    }
    if (u.gate == nullptr || u.up == nullptr || u.down == nullptr ||
        reinterpret_cast<uintptr_t>(u.gate) % gu_align != 0 || reinterpret_cast<uintptr_t>(u.up) % gu_align != 0 ||
        reinterpret_cast<uintptr_t>(u.down) % d_align != 0) {
      return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": null matrix or one not aligned to ",
                                                     gu_align, " (gate/up) / ", d_align, " (down) bytes"));
    }
    for (int r = 0; r < u.rows; ++r) {
      if (u.input_row[r] < 0 || u.input_row[r] >= options_.max_input_rows) {
        return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": input_row[", r, "]=", u.input_row[r],
                                                       " outside [0, ", options_.max_input_rows, ")"));
      }
      input_rows = std::max(input_rows, u.input_row[r] + 1);
    }
    slots = std::max(slots, u.first_slot + u.rows);
  }
  if (slots > max_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: slots up to ", slots, ", capacity ", max_slots_));
  }
  if (reinterpret_cast<uintptr_t>(partial) % 8 != 0) {
    return absl::InvalidArgumentError("ExpertPrefillRunner: partial is not 8-byte aligned");
  }
  const std::vector<PrefillGroup> groups = GroupUnits(units);
  const bool streamed = options_.algorithm == PrefillAlgorithm::kGroupedTiles && UsesStreamedKernel(shape_, options_.tile_rows);
  PrefillKernel kernel = streamed ? options_.streamed_kernel : PrefillKernel::kPipelined;
  int tile_rows = options_.tile_rows;
  // The integer-MMA kernel (expert_prefill_mmq.cu): asked for, or kStreamedAuto at a chosen height
  // (unless TANDEM_PREFILL_MMQ=0, the A/B switch for the end-to-end benches); a shape it does not
  // fit runs kStreamed.
  const int mmq_tile = mmq_x_.get() != nullptr ? ChooseMmqTile(groups) : 0;
  const bool mmq = mmq_x_.get() != nullptr &&
                   (IsMmqKernel(kernel) ||
                    (kernel == PrefillKernel::kStreamedAuto && tile_rows == 0 && MmqByDefault() && mmq_tile == 16));
  if (mmq) {
    if (kernel == PrefillKernel::kStreamedAuto) kernel = MmqAutoKernel();
    if (tile_rows == 0) tile_rows = mmq_tile;
  } else if (IsMmqKernel(kernel)) {
    kernel = PrefillKernel::kStreamed;
  }
  // Small-group dispatch (the row-streamed kernel, expert_prefill_rows.cuh): kStreamedAuto or
  // kStreamedRows resolved here to kStreamedRows at a tile bound of 16 or 32, or to kStreamed.
  if (kernel == PrefillKernel::kStreamedAuto || kernel == PrefillKernel::kStreamedRows) {
    const bool automatic = kernel == PrefillKernel::kStreamedAuto;
    int rows_tile = 0;  // 0: kStreamed
    if (UsesStreamedRowsKernel(shape_) && !(automatic && tile_rows != 0)) {
      rows_tile = tile_rows != 0 ? tile_rows : ChooseStreamedRowsTile(groups, automatic);
    }
    kernel = rows_tile != 0 ? PrefillKernel::kStreamedRows : PrefillKernel::kStreamed;
    if (rows_tile != 0) tile_rows = rows_tile;
  }
  // Large groups (the 8192-token regime): kStreamedAuto takes WgmmaAutoKernel() (kWgmmaWs;
  // ChooseWgmmaTile; TANDEM_PREFILL_WGMMA=1 takes kWgmma, =0 keeps kStreamed).
  if (kernel == PrefillKernel::kStreamed && options_.streamed_kernel == PrefillKernel::kStreamedAuto && tile_rows == 0) {
    if (const int wgmma_tile = ChooseWgmmaTile(shape_, groups); wgmma_tile != 0) {
      kernel = WgmmaAutoKernel();
      tile_rows = wgmma_tile;
    }
  }
  if (IsWgmmaKernel(kernel) && tile_rows == 0) tile_rows = kWgmmaMaxTileRows;
  // Streamed: one launch of tiles of at most tile_rows (64 by default; the wgmma kernels 256) rows. Pipelined with a
  // chosen height: each tile at its PrefillTileClass (tiles ordered by falling height); with a
  // fixed height: every tile at tile_rows.
  const bool by_class = !streamed && options_.tile_rows == 0;
  if (tile_rows == 0) tile_rows = streamed ? kStreamedMaxTileRows : ChoosePrefillTileRows(groups, by_class);
  std::vector<PrefillTile> tiles = MakePrefillTiles(groups, tile_rows);
  last_tile_rows_ = tile_rows;
  last_kernel_ = kernel;
  struct Launch {  // `count` tiles from `first`, at `height`
    int height, first, count;
  };
  std::vector<Launch> launches;
  if (by_class) {
    std::stable_sort(tiles.begin(), tiles.end(), [](const PrefillTile& a, const PrefillTile& b) {
      return PrefillTileClass(a.rows) > PrefillTileClass(b.rows);  // tall tiles first: shorter tail
    });
    for (int i = 0; i < static_cast<int>(tiles.size()); ++i) {
      const int height = PrefillTileClass(tiles[i].rows);
      if (launches.empty() || launches.back().height != height) launches.push_back({height, i, 0});
      ++launches.back().count;
    }
  } else {
    launches.push_back({tile_rows, 0, static_cast<int>(tiles.size())});
  }

  // One upload: the input row of every slot, then the tiles.
  if (pending_) TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_.get()));
  uint8_t* staging = index_staging_.as<uint8_t>();
  int32_t* index = reinterpret_cast<int32_t*>(staging);
  std::memset(index, 0, static_cast<size_t>(slots) * sizeof(int32_t));
  for (const ExpertUnit& u : units) {
    for (int r = 0; r < u.rows; ++r) index[u.first_slot + r] = u.input_row[r];
  }
  const size_t tile_offset = TileOffset(max_slots_);
  std::memcpy(staging + tile_offset, tiles.data(), tiles.size() * sizeof(PrefillTile));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(index_.get(), staging, tile_offset + tiles.size() * sizeof(PrefillTile),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.get(), stream));
  pending_ = true;

  const int h = static_cast<int>(shape_.h), I = static_cast<int>(shape_.inner);
  const PrefillTile* device_tiles = reinterpret_cast<const PrefillTile*>(index_.as<uint8_t>() + tile_offset);
  if (mmq) {
    const int num_tiles = static_cast<int>(tiles.size());
    const MmqActivations xq = MmqActivationPlanes(mmq_x_.get(), options_.max_input_rows, h);
    const MmqActivations aq = MmqActivationPlanes(mmq_act_q_.get(), max_slots_, I);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqQuantize(x, input_rows, h, xq, stream));
    cudaError_t e = LaunchMmqGateUp(kernel, tile_rows, device_tiles, num_tiles, xq, index_.as<int32_t>(), h, I,
                                    mmq_act_.as<float>(), stream);
    if (e == cudaErrorInvalidValue) return absl::InvalidArgumentError("prefill gate/up: shape refused by the MMQ kernel");
    TANDEM_CUDA_RETURN_IF_ERROR(e);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchMmqQuantize(mmq_act_.as<float>(), slots, I, aq, stream));
    e = LaunchMmqDown(kernel, tile_rows, device_tiles, num_tiles, aq, h, I, partial, stream);
    if (e == cudaErrorInvalidValue) return absl::InvalidArgumentError("prefill down: shape refused by the MMQ kernel");
    TANDEM_CUDA_RETURN_IF_ERROR(e);
    return absl::OkStatus();
  }
  uint16_t* xb = x_f16_.as<uint16_t>();
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchConvertToF16(x, static_cast<int64_t>(input_rows) * h, xb, stream));
  uint16_t* act = act_.as<uint16_t>();
  for (const Launch& l : launches) {
    const cudaError_t e = LaunchPrefillGateUp(kernel, gu_type, l.height, device_tiles + l.first, l.count, xb,
                                              index_.as<int32_t>(), h, I, act, stream, nullptr, Schedule(false));
    if (e == cudaErrorInvalidValue) {
      return absl::InvalidArgumentError(absl::StrCat("prefill gate/up: type ", gu_type, " or shape refused by the kernels"));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(e);
  }
  for (const Launch& l : launches) {
    const cudaError_t e =
        LaunchPrefillDown(kernel, d_type, l.height, device_tiles + l.first, l.count, act, h, I, partial, stream, nullptr,
                          Schedule(true));
    if (e == cudaErrorInvalidValue) {
      return absl::InvalidArgumentError(absl::StrCat("prefill down: type ", d_type, " or shape refused by the kernels"));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(e);
  }
  return absl::OkStatus();
}

absl::Status ExpertPrefillRunner::RunCublas(std::span<const ExpertUnit> units, const float* x, float* partial,
                                            cudaStream_t stream) {
  const int h = static_cast<int>(shape_.h), I = static_cast<int>(shape_.inner);
  const uint32_t gu_type = static_cast<uint32_t>(shape_.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape_.down_type);
  // Input row of every slot.
  int32_t slots = 0;
  for (const ExpertUnit& u : units) slots = std::max(slots, u.first_slot + u.rows);
  if (slots > max_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: slots up to ", slots, ", capacity ", max_slots_));
  }
  if (pending_) TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_.get()));
  int32_t* index = index_staging_.as<int32_t>();
  std::memset(index, 0, static_cast<size_t>(slots) * sizeof(int32_t));
  for (size_t i = 0; i < units.size(); ++i) {
    const ExpertUnit& u = units[i];
    if (u.rows < 1 || u.rows > kMaxUnitRows || u.first_slot < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": rows=", u.rows, " first_slot=", u.first_slot));
    }
    for (int r = 0; r < u.rows; ++r) index[u.first_slot + r] = u.input_row[r];
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(index_.get(), index, static_cast<size_t>(slots) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.get(), stream));
  pending_ = true;
  if (absl::Status s = BlasStatus(cublasSetStream(blas_->handle, stream), "cublasSetStream"); !s.ok()) return s;

  uint16_t* wgu = w_gate_up_.as<uint16_t>();
  uint16_t* wd = w_down_.as<uint16_t>();
  const float one = 1.0f, zero = 0.0f;
  for (const PrefillGroup& g : GroupUnits(units)) {
    const int m = g.rows;
    const cudaError_t e1 = LaunchDequantizeToF16(gu_type, g.where.gate, h, I, wgu, stream);
    const cudaError_t e2 = LaunchDequantizeToF16(gu_type, g.where.up, h, I, wgu + static_cast<size_t>(I) * h, stream);
    const cudaError_t e3 = LaunchDequantizeToF16(d_type, g.where.down, I, h, wd, stream);
    for (cudaError_t e : {e1, e2, e3}) {
      if (e == cudaErrorInvalidValue) {
        return absl::InvalidArgumentError(absl::StrCat("prefill expert at slot ", g.first_slot,
                                                       ": type, shape or alignment refused by the f16 dequantizer"));
      }
      TANDEM_CUDA_RETURN_IF_ERROR(e);
    }
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchGatherRowsF16(x, h, index_.as<int32_t>() + g.first_slot, m, x_rows_.as<uint16_t>(), stream));
    // Row-major gu (m × 2I) = X (m × h)·Wgu^T is column-major gu^T (2I × m) = op_T(Wgu as h × 2I)·X^T.
    if (absl::Status s = BlasStatus(
            cublasGemmEx(blas_->handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, m, h, &one, wgu, CUDA_R_16F, h,
                         x_rows_.get(), CUDA_R_16F, h, &zero, gu_.get(), CUDA_R_32F, 2 * I, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "gate/up GEMM");
        !s.ok()) {
      return s;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMulToF16(gu_.as<float>(), m, I, act_.as<uint16_t>(), stream));
    if (absl::Status s = BlasStatus(
            cublasGemmEx(blas_->handle, CUBLAS_OP_T, CUBLAS_OP_N, h, m, I, &one, wd, CUDA_R_16F, I, act_.get(),
                         CUDA_R_16F, I, &zero, partial + static_cast<int64_t>(g.first_slot) * h, CUDA_R_32F, h,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "down GEMM");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
