#include "gpu_service/backends/cuda/backend/device_model.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"

namespace tandem::cuda {
namespace {

// Dense products go through the dense matvec / GEMM family, experts through the MoE family,
// which reads a superset of types (weight_type_ids.h).
bool DenseTypeOk(WeightType t) { return DenseKernelsSupportType(static_cast<uint32_t>(t)); }

// Q8_0 matrices that only the dense matvec and the dense GEMM read (Product in layer_loop.cc)
// are uploaded as Q8_0x8 (device_matrix.h): 16-byte quant loads for the decode matvec. The
// environment variable TANDEM_Q8_0_GGML_LAYOUT=1 (read once) keeps the ggml layout, for A/B runs.
// Smaller matrices stay Q8_0: their launches are latency-bound and Q8_0x8 measured no faster
// (H200, 2026-12-01: ssm_ba 2048 -> 64, 0.14 MB, 2.31 against 2.24 us at n = 1, 4.14 against
// 3.78 us at n = 4; from 1.1 MB on, e.g. attn_k 2048 -> 512, Q8_0x8 was faster at n = 1..8).
constexpr int64_t kRegroupMinBytes = int64_t{1} << 20;

bool RegroupQ8_0() {
  static const bool on = !EnvSwitch("TANDEM_Q8_0_GGML_LAYOUT");
  return on;
}

ProcessSwitch g_stacked_decode_inputs{[] { return !EnvSwitch("TANDEM_OLD_DECODE_INPUTS"); }};

ProcessSwitch g_gdn_stacked_z_side{[] { return EnvSwitchDefaultOn("TANDEM_GDN_DECODE_Z_SIDE"); }};

ProcessSwitch g_gdn_out_by_columns{[] { return EnvSwitchDefaultOn("TANDEM_GDN_OUT_BY_COLUMNS"); }};

ProcessInteger g_route_through_out{[] { return EnvInteger("TANDEM_ROUTE_THROUGH_OUT", 2, 0, 2); }};

// The router rows a layer's output product can carry (GpuLayer::route_rows), from host views only
// (the same answer in both of UploadModel's passes): E router rows (+ the shared gate's) of f32,
// read by a one-stream plain ffn norm, over an output matrix (GDN's ssm_out, with its copy by
// columns; attention's o) of Q8_0 whole super-blocks that the upload regroups to Q8_0x8, with the
// column-split kernels' row limit (8 row slices of at most 640 rows). 0: none.
int64_t RouteRowsFor(const ModelConfig& c, const LayerWeights& lw, int route_mode, bool by_columns) {
  const MoeWeights& moe = lw.moe;
  const bool gdn = lw.kind == LayerKind::kGdn;
  const MatrixView& out = gdn ? lw.gdn.out : lw.attn.output;
  if (route_mode < (gdn ? 1 : 2) || (gdn && !by_columns) || c.n_streams != 1 || lw.ffn_read.down.present() ||
      static_cast<int64_t>(lw.ffn_read.norm.size()) != c.h || !moe.router.present() ||
      moe.router.type != WeightType::kF32 || moe.router.cols != c.h || out.type != WeightType::kQ8_0 ||
      out.rows != c.h || out.cols % 256 != 0 || out.row_bytes < out.cols / 32 * 34) {
    return 0;
  }
  const bool gate = moe.shared_gate_inp.present();
  if (gate && (moe.shared_gate_inp.type != WeightType::kF32 || moe.shared_gate_inp.cols != c.h ||
               moe.shared_gate_inp.rows != 1)) {
    return 0;
  }
  const int64_t R = moe.router.rows + (gate ? 1 : 0);
  const int64_t total = RouteOutRows(c.h, R);
  return total % 8 == 0 && total / 8 <= 640 ? R : 0;
}

ProcessSwitch g_attn_stacked_kv_side{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_DECODE_KV_SIDE"); }};

// One matrix over the rows of `parts` when they are placed (data not null) back to back in this
// order with the same type, width and row stride: each starts where the previous one ends. Absent
// otherwise.
DeviceMatrix AdjacentView(std::initializer_list<const DeviceMatrix*> parts) {
  const DeviceMatrix& first = **parts.begin();
  const uint8_t* next = static_cast<const uint8_t*>(first.data);
  DeviceMatrix v;
  for (const DeviceMatrix* m : parts) {
    if (m->data == nullptr || m->type != first.type || m->cols != first.cols || m->row_bytes != first.row_bytes ||
        m->data != next) {
      return DeviceMatrix{};
    }
    next += m->rows * m->row_bytes;
    v.rows += m->rows;
  }
  v.type = first.type;
  v.cols = first.cols;
  v.row_bytes = first.row_bytes;
  v.data = first.data;
  return v;
}

// Lays tensors out in one allocation. Run twice over the same binding code: first to count bytes
// (base == nullptr), then to copy and hand out device addresses. stack_inputs: StackedDecodeInputs(),
// read once per upload so that both passes make the same layout.
class Placer {
 public:
  Placer(char* base, bool stack_inputs, bool out_by_columns, int route_mode)
      : base_(base), stack_inputs_(stack_inputs), out_by_columns_(out_by_columns), route_mode_(route_mode) {}
  bool counting() const { return base_ == nullptr; }
  bool out_by_columns() const { return out_by_columns_; }
  int route_mode() const { return route_mode_; }
  const void* Put(const void* src, size_t bytes) {
    const size_t off = Reserve(bytes);
    if (base_ == nullptr || bytes == 0 || !status_.ok()) return nullptr;
    status_ = CudaStatus(cudaMemcpy(base_ + off, src, bytes, cudaMemcpyHostToDevice), "upload",
                         __FILE__, __LINE__);
    return base_ + off;
  }
  // A copy of the placed Q8_0x8 matrix m by columns (device_matrix.h) for the fused GDN kernel's
  // output product (GpuLayer::ssm_out_by_columns), made on the device; null while counting, with
  // out_by_columns off, or for another type (the same host-side answer in both passes).
  // total_rows (0: m.rows): the copy's rows, m's first (the router rows ComposeRoute appends).
  const void* ByColumns(const DeviceMatrix& m, int64_t total_rows = 0) {
    if (!out_by_columns_ || m.type != kTypeQ8_0x8 || m.cols % 256 != 0 || m.rows <= 0) return nullptr;
    if (total_rows == 0) total_rows = m.rows;
    const size_t off = Reserve(static_cast<size_t>(Q8_0x8ByColumnsBytes(total_rows, m.cols)));
    if (base_ == nullptr || !status_.ok()) return nullptr;
    status_ = CudaStatus(CopyQ8_0x8ByColumns(m, base_ + off, nullptr, total_rows), "upload by columns", __FILE__,
                         __LINE__);
    if (status_.ok()) status_ = CudaStatus(cudaStreamSynchronize(nullptr), "upload by columns", __FILE__, __LINE__);
    return status_.ok() ? base_ + off : nullptr;
  }
  // Room for `extra` more rows right after the placed Q8_0x8 matrix m (Matrix just before, with
  // nothing placed between): the view over m's rows and those, or absent (counting, an error, or m
  // not ending on a placement boundary, when the rows would not be adjacent).
  DeviceMatrix AppendRows(const DeviceMatrix& m, int64_t extra) {
    const size_t bytes = static_cast<size_t>(m.rows * m.row_bytes);
    if (m.type != kTypeQ8_0x8 || bytes % 256 != 0) return DeviceMatrix{};
    const size_t off = Reserve(static_cast<size_t>(extra * m.row_bytes));
    if (base_ == nullptr || !status_.ok() || base_ + off != static_cast<const char*>(m.data) + bytes) {
      return DeviceMatrix{};
    }
    DeviceMatrix v = m;
    v.rows += extra;
    return v;
  }
  // The router rows through the output product (route_compose.cuh) into g's by-columns copy of
  // ssm_out (ByColumns(g.ssm_out, g.ssm_out_by_columns_rows)) or after o's rows (g.o_route, from
  // AppendRows): Wr·diag(γ) formed here from the host views (router rows, then the shared gate's
  // row), composed with the output matrix on the device in temporary buffers (load time). Returns
  // the placed 1 / S_r (null while counting or on error).
  const float* ComposeRoute(const GpuLayer& g, const LayerWeights& lw, int64_t R) {
    const bool gdn = g.kind == LayerKind::kGdn;
    const DeviceMatrix& out = gdn ? g.ssm_out : g.o;
    const int64_t padded = RoutePaddedRows(R), h = out.rows;
    const size_t off = Reserve(static_cast<size_t>(padded) * sizeof(float));
    if (base_ == nullptr || !status_.ok() || (gdn ? g.ssm_out_by_columns == nullptr : !g.o_route.present())) {
      return nullptr;
    }
    const RouteRowsTarget to =
        gdn ? RouteRowsTarget{const_cast<void*>(g.ssm_out_by_columns), kQ8_0x8SuperBytes,
                              g.ssm_out_by_columns_rows * kQ8_0x8SuperBytes, h}
            : RouteRowsTarget{const_cast<void*>(g.o_route.data), g.o_route.row_bytes, kQ8_0x8SuperBytes, h};
    std::vector<float> wr(static_cast<size_t>(R * h));
    for (int64_t r = 0; r < R; ++r) {
      const MatrixView& m = r < lw.moe.router.rows ? lw.moe.router : lw.moe.shared_gate_inp;
      const float* row = reinterpret_cast<const float*>(m.row(r < lw.moe.router.rows ? r : 0));
      for (int64_t j = 0; j < h; ++j) wr[static_cast<size_t>(r * h + j)] = row[j] * lw.ffn_read.norm[static_cast<size_t>(j)];
    }
    absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(wr.size() * sizeof(float));
    absl::StatusOr<DeviceBuffer> scratch = DeviceBuffer::Allocate(static_cast<size_t>(R * out.cols) * sizeof(float));
    if (!a.ok() || !scratch.ok()) {
      status_ = !a.ok() ? a.status() : scratch.status();
      return nullptr;
    }
    float* inv_scale = reinterpret_cast<float*>(base_ + off);
    status_ = CudaStatus(cudaMemcpy(a->get(), wr.data(), wr.size() * sizeof(float), cudaMemcpyHostToDevice),
                         "upload router rows", __FILE__, __LINE__);
    if (status_.ok()) {
      status_ = CudaStatus(ComposeRouteRows(a->as<float>(), R, out, to, inv_scale, scratch->as<float>(), nullptr),
                           "compose router rows", __FILE__, __LINE__);
    }
    if (status_.ok()) status_ = CudaStatus(cudaStreamSynchronize(nullptr), "compose router rows", __FILE__, __LINE__);
    return status_.ok() ? inv_scale : nullptr;
  }
  const float* Vector(VectorView v) {
    if (v.empty()) return nullptr;
    return static_cast<const float*>(Put(v.data(), v.size() * sizeof(float)));
  }
  // dense: read by the dense kernels (the type must have one). product_only: read only through
  // LaunchDenseMatVec / DenseGemm (Run, Prepare), which take Q8_0x8: a Q8_0 matrix of whole
  // super-blocks is regrouped. Others (embedding table, router, shared expert, engram) keep
  // ggml's layout, which their kernels read.
  // stacked: a part of a decode input stack (Stackable), regrouped whatever its size.
  DeviceMatrix Matrix(const char* name, const MatrixView& m, bool dense = true, bool product_only = false,
                      bool stacked = false) {
    DeviceMatrix g;
    if (!m.present()) return g;
    if (dense && !DenseTypeOk(m.type) && problems_.empty()) {
      problems_ = absl::StrCat(name, ": weight type ", static_cast<uint32_t>(m.type),
                               " has no GPU dense kernel");
    }
    g.type = static_cast<uint32_t>(m.type);
    g.cols = m.cols;
    g.rows = m.rows;
    g.row_bytes = m.row_bytes;
    if (product_only && g.type == kTypeQ8_0 && m.cols % 256 == 0 && m.row_bytes >= m.cols / 32 * 34 &&
        (stacked || m.rows * m.row_bytes >= kRegroupMinBytes) && RegroupQ8_0()) {
      g.type = kTypeQ8_0x8;
      g.row_bytes = Q8_0x8RowBytes(m.cols);
      const size_t bytes = static_cast<size_t>(m.rows * g.row_bytes);
      if (base_ == nullptr || !status_.ok()) {
        g.data = Put(m.data, bytes);  // counting: nothing is read
      } else {
        std::vector<uint8_t> regrouped(bytes);
        RepackQ8_0x8(static_cast<const uint8_t*>(m.data), m.row_bytes, m.rows, m.cols, regrouped.data());
        g.data = Put(regrouped.data(), bytes);
      }
      return g;
    }
    g.data = Put(m.data, static_cast<size_t>(m.rows * m.row_bytes));
    return g;
  }
  // Whether the mixer input matrices `parts` (uploaded next, in this order, by Matrix(..., true,
  // true, true) with nothing placed between them) become one Q8_0x8 matrix: all Q8_0 of whole
  // super-blocks over the same cols, each part but the last ending on a placement boundary. The
  // same answer in both passes (host values only), so both lay the model out alike.
  bool Stackable(std::initializer_list<const MatrixView*> parts) const {
    if (!stack_inputs_ || !RegroupQ8_0() || parts.size() < 2) return false;
    std::vector<int64_t> rows;
    const int64_t cols = (*parts.begin())->cols;
    for (const MatrixView* m : parts) {
      if (!m->present() || m->type != WeightType::kQ8_0 || m->cols != cols || cols % 256 != 0 || m->rows <= 0 ||
          m->row_bytes < cols / 32 * 34) {
        return false;
      }
      rows.push_back(m->rows);
    }
    return Q8_0x8PartsAdjacent(cols, rows.data(), rows.size());
  }
  // The view over the rows of `parts` (placed by Matrix after Stackable said yes), checked: every
  // part Q8_0x8 of the same row length, each starting where the previous one ends. Absent while
  // counting, after an upload error, or when a check fails (the parts then stay separate products).
  DeviceMatrix StackView(std::initializer_list<const DeviceMatrix*> parts) const {
    if (base_ == nullptr || !status_.ok() || (*parts.begin())->type != kTypeQ8_0x8) return DeviceMatrix{};
    return AdjacentView(parts);
  }
  GpuExperts Experts(const ExpertMatrixView& m) {
    GpuExperts g;
    g.type = static_cast<uint32_t>(m.type);
    g.cols = m.cols;
    g.rows = m.rows;
    g.experts = m.experts;
    g.row_bytes = m.row_bytes;
    g.data = static_cast<const uint8_t*>(Put(m.data, static_cast<size_t>(m.experts * m.rows * m.row_bytes)));
    return g;
  }
  GpuHcRead Read(const char* name, const HcWeights& w) {
    GpuHcRead r;
    r.norm = Vector(w.norm);
    r.down = Matrix(name, w.down, true, true);
    r.up = Matrix(name, w.up, true, true);
    r.inject = Matrix(name, w.inject, true, true);
    return r;
  }
  size_t used() const { return used_; }
  const absl::Status& status() const { return status_; }
  const std::string& problems() const { return problems_; }

 private:
  char* base_;
  bool stack_inputs_;
  bool out_by_columns_;
  int route_mode_;  // RouteThroughOutMode(), read once per upload
  size_t Reserve(size_t bytes) {
    const size_t off = (used_ + 255) / 256 * 256;
    used_ = off + bytes;
    return off;
  }
  size_t used_ = 0;
  absl::Status status_;
  std::string problems_;
};

// router (E rows) and gate (one row) as one (E + 1)-row matrix when gate starts where router ends
// with the same type, width and row stride; absent otherwise (and in Bind's counting pass, which
// places nothing).
DeviceMatrix RouterAndGate(const DeviceMatrix& router, const DeviceMatrix& gate) {
  if (!router.present() || gate.rows != 1) return DeviceMatrix{};
  return AdjacentView({&router, &gate});
}

void Bind(const ModelConfig& c, const ModelWeights& w, const std::vector<double>& inv_freq, Placer& p,
          DeviceModel& m) {
  m.token_embd = p.Matrix("token_embd", w.token_embd);
  m.output = p.Matrix("output", w.output, true, true);
  m.output_read = p.Read("output read", w.output_read);
  m.rope_inv_freq = static_cast<const double*>(p.Put(inv_freq.data(), inv_freq.size() * sizeof(double)));
  m.layers.assign(static_cast<size_t>(c.n_layers), GpuLayer{});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeights& lw = w.layers[i];
    GpuLayer& g = m.layers[i];
    g.kind = lw.kind;
    int64_t route_rows_pending = 0;  // router rows appended to ssm_out's copy (RouteRowsFor)
    g.attn_read = p.Read("attn read", lw.attn_read);
    g.ffn_read = p.Read("ffn read", lw.ffn_read);
    if (lw.kind == LayerKind::kGdn) {
      // z, qkv and ba adjacent in that order (nothing placed between them) when they stack:
      // GpuLayer::mixer_in and qkv_ba. Else in the order of before.
      if (p.Stackable({&lw.gdn.gate, &lw.gdn.qkv, &lw.gdn.ba})) {
        g.z = p.Matrix("attn_gate", lw.gdn.gate, true, true, true);
        g.qkv = p.Matrix("attn_qkv", lw.gdn.qkv, true, true, true);
        g.ba = p.Matrix("ssm_ba", lw.gdn.ba, true, true, true);
        g.mixer_in = p.StackView({&g.z, &g.qkv, &g.ba});
        if (g.mixer_in.present()) g.qkv_ba = p.StackView({&g.qkv, &g.ba});
      } else {
        g.qkv = p.Matrix("attn_qkv", lw.gdn.qkv, true, true);
        g.z = p.Matrix("attn_gate", lw.gdn.gate, true, true);
        g.ba = p.Matrix("ssm_ba", lw.gdn.ba, true, true);
      }
      g.ssm_out = p.Matrix("ssm_out", lw.gdn.out, true, true);
      // Router rows through the output product: only where the copy by columns is made (Q8_0x8).
      const int64_t route = g.ssm_out.type == kTypeQ8_0x8 ? RouteRowsFor(c, lw, p.route_mode(), p.out_by_columns()) : 0;
      g.ssm_out_by_columns_rows = RouteOutRows(g.ssm_out.rows, route);
      g.ssm_out_by_columns = p.ByColumns(g.ssm_out, g.ssm_out_by_columns_rows);
      if (g.ssm_out_by_columns == nullptr) g.ssm_out_by_columns_rows = g.ssm_out.rows;
      route_rows_pending = g.ssm_out_by_columns != nullptr || p.counting() ? route : 0;
      g.conv1d = p.Vector(lw.gdn.conv1d);
      g.ssm_a = p.Vector(lw.gdn.a);
      g.dt_bias = p.Vector(lw.gdn.dt_bias);
      g.ssm_norm = p.Vector(lw.gdn.norm);
    } else {
      // q, k and v likewise (GpuLayer::mixer_in).
      const bool stack = p.Stackable({&lw.attn.q, &lw.attn.k, &lw.attn.v});
      g.q = p.Matrix("attn_q", lw.attn.q, true, true, stack);
      g.k = p.Matrix("attn_k", lw.attn.k, true, true, stack);
      g.v = p.Matrix("attn_v", lw.attn.v, true, true, stack);
      if (stack) g.mixer_in = p.StackView({&g.q, &g.k, &g.v});
      if (g.mixer_in.present()) g.kv = p.StackView({&g.k, &g.v});
      g.o = p.Matrix("attn_output", lw.attn.output, true, true);
      // Router rows through the output product: right after o's rows (GpuLayer::o_route).
      const int64_t route = g.o.type == kTypeQ8_0x8 ? RouteRowsFor(c, lw, p.route_mode(), p.out_by_columns()) : 0;
      if (route > 0) g.o_route = p.AppendRows(g.o, 2 * RoutePaddedRows(route));
      route_rows_pending = g.o_route.present() || p.counting() ? route : 0;
      g.q_norm = p.Vector(lw.attn.q_norm);
      g.k_norm = p.Vector(lw.attn.k_norm);
      g.idx_qk = p.Matrix("attn_idx_qk", lw.attn.idx_qk, true, true);
      g.idx_q_norm = p.Vector(lw.attn.idx_q_norm);
      g.idx_k_norm = p.Vector(lw.attn.idx_k_norm);
    }
    // The shared gate vector right after the router (no tensor between them): back to back when
    // the router's bytes are a multiple of Put's 256-byte alignment (E·h a multiple of 64).
    g.router = p.Matrix("ffn_gate_inp", lw.moe.router);
    g.shared_gate_inp = p.Matrix("ffn_gate_inp_shexp", lw.moe.shared_gate_inp);
    g.router_and_gate = RouterAndGate(g.router, g.shared_gate_inp);
    g.shared_gate = p.Matrix("ffn_gate_shexp", lw.moe.shared_gate, /*dense=*/false);
    g.shared_up = p.Matrix("ffn_up_shexp", lw.moe.shared_up, false);
    g.shared_down = p.Matrix("ffn_down_shexp", lw.moe.shared_down, false);
    if (route_rows_pending > 0) {
      g.route_inv_scale = p.ComposeRoute(g, lw, route_rows_pending);
      if (g.route_inv_scale != nullptr) g.route_rows = route_rows_pending;
    }
    g.gate_exps = p.Experts(lw.moe.gate);
    g.up_exps = p.Experts(lw.moe.up);
    g.down_exps = p.Experts(lw.moe.down);
    g.has_engram = lw.has_engram;
    if (lw.has_engram) {
      g.engram_key = p.Matrix("engram_key", lw.engram.key, false);
      g.engram_value = p.Matrix("engram_value", lw.engram.value, false);
      g.engram_key_norm = p.Vector(lw.engram.key_norm);
      g.engram_query_norm = p.Vector(lw.engram.query_norm);
      g.engram_conv_norm = p.Vector(lw.engram.conv_norm);
      g.engram_conv = p.Vector(lw.engram.conv);
    }
  }
}

}  // namespace

bool StackedDecodeInputs() { return g_stacked_decode_inputs.on(); }
void SetStackedDecodeInputs(bool on) { g_stacked_decode_inputs.set(on); }
bool GdnStackedZSide() { return g_gdn_stacked_z_side.on(); }
void SetGdnStackedZSide(bool on) { g_gdn_stacked_z_side.set(on); }
bool GdnOutByColumns() { return g_gdn_out_by_columns.on(); }
void SetGdnOutByColumns(bool on) { g_gdn_out_by_columns.set(on); }
int RouteThroughOutMode() { return static_cast<int>(g_route_through_out.value()); }
bool RouteThroughOut() { return RouteThroughOutMode() > 0; }
void SetRouteThroughOut(bool on) { g_route_through_out.set(on ? 1 : 0); }
void SetRouteThroughOutMode(int mode) { g_route_through_out.set(mode); }
bool AttnStackedKvSide() { return g_attn_stacked_kv_side.on(); }
void SetAttnStackedKvSide(bool on) { g_attn_stacked_kv_side.set(on); }

bool Q8_0x8PartsAdjacent(int64_t cols, const int64_t* rows, size_t count) {
  if (cols <= 0 || cols % 256 != 0 || count == 0) return false;
  for (size_t i = 0; i + 1 < count; ++i) {
    if (rows[i] <= 0 || rows[i] * Q8_0x8RowBytes(cols) % 256 != 0) return false;
  }
  return rows[count - 1] > 0;
}

absl::StatusOr<std::unique_ptr<DeviceModel>> UploadModel(const ModelConfig& config,
                                                         const ModelWeights& weights) {
  auto m = std::make_unique<DeviceModel>();
  const std::vector<double> inv_freq =
      RopeInvFrequencies(config.attn.theta, static_cast<int>(config.attn.rot));
  const bool stack_inputs = StackedDecodeInputs(), out_by_columns = GdnOutByColumns();
  const int route = RouteThroughOutMode();
  Placer count(nullptr, stack_inputs, out_by_columns, route);
  Bind(config, weights, inv_freq, count, *m);
  if (!count.problems().empty()) return absl::InvalidArgumentError(count.problems());
  absl::StatusOr<DeviceBuffer> storage = DeviceBuffer::Allocate(count.used());
  if (!storage.ok()) return storage.status();
  m->storage = *std::move(storage);
  m->bytes = count.used();
  Placer place(m->storage.as<char>(), stack_inputs, out_by_columns, route);
  Bind(config, weights, inv_freq, place, *m);
  if (!place.status().ok()) return place.status();
  return m;
}

}  // namespace tandem::cuda
