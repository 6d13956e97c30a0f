#include "gpu_service/backends/cuda/backend/device_model.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"

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

// Lays tensors out in one allocation. Run twice over the same binding code: first to count bytes
// (base == nullptr), then to copy and hand out device addresses.
class Placer {
 public:
  explicit Placer(char* base) : base_(base) {}
  const void* Put(const void* src, size_t bytes) {
    const size_t off = (used_ + 255) / 256 * 256;
    used_ = off + bytes;
    if (base_ == nullptr || bytes == 0 || !status_.ok()) return nullptr;
    status_ = CudaStatus(cudaMemcpy(base_ + off, src, bytes, cudaMemcpyHostToDevice), "upload",
                         __FILE__, __LINE__);
    return base_ + off;
  }
  const float* Vector(VectorView v) {
    if (v.empty()) return nullptr;
    return static_cast<const float*>(Put(v.data(), v.size() * sizeof(float)));
  }
  // dense: read by the dense kernels (the type must have one). product_only: read only through
  // LaunchDenseMatVec / DenseGemm (Run, Prepare), which take Q8_0x8: a Q8_0 matrix of whole
  // super-blocks is regrouped. Others (embedding table, router, shared expert, engram) keep
  // ggml's layout, which their kernels read.
  DeviceMatrix Matrix(const char* name, const MatrixView& m, bool dense = true, bool product_only = false) {
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
        m.rows * m.row_bytes >= kRegroupMinBytes && RegroupQ8_0()) {
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
  size_t used_ = 0;
  absl::Status status_;
  std::string problems_;
};

// router (E rows) and gate (one row) as one (E + 1)-row matrix when gate starts where router ends
// with the same type, width and row stride; absent otherwise (and in Bind's counting pass, which
// places nothing).
DeviceMatrix RouterAndGate(const DeviceMatrix& router, const DeviceMatrix& gate) {
  if (!router.present() || !gate.present() || router.data == nullptr || gate.rows != 1 || gate.type != router.type ||
      gate.cols != router.cols || gate.row_bytes != router.row_bytes ||
      static_cast<const uint8_t*>(router.data) + router.rows * router.row_bytes != gate.data) {
    return DeviceMatrix{};
  }
  DeviceMatrix both = router;
  both.rows = router.rows + 1;
  return both;
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
    g.attn_read = p.Read("attn read", lw.attn_read);
    g.ffn_read = p.Read("ffn read", lw.ffn_read);
    if (lw.kind == LayerKind::kGdn) {
      g.qkv = p.Matrix("attn_qkv", lw.gdn.qkv, true, true);
      g.z = p.Matrix("attn_gate", lw.gdn.gate, true, true);
      g.ba = p.Matrix("ssm_ba", lw.gdn.ba, true, true);
      g.ssm_out = p.Matrix("ssm_out", lw.gdn.out, true, true);
      g.conv1d = p.Vector(lw.gdn.conv1d);
      g.ssm_a = p.Vector(lw.gdn.a);
      g.dt_bias = p.Vector(lw.gdn.dt_bias);
      g.ssm_norm = p.Vector(lw.gdn.norm);
    } else {
      g.q = p.Matrix("attn_q", lw.attn.q, true, true);
      g.k = p.Matrix("attn_k", lw.attn.k, true, true);
      g.v = p.Matrix("attn_v", lw.attn.v, true, true);
      g.o = p.Matrix("attn_output", lw.attn.output, true, true);
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

absl::StatusOr<std::unique_ptr<DeviceModel>> UploadModel(const ModelConfig& config,
                                                         const ModelWeights& weights) {
  auto m = std::make_unique<DeviceModel>();
  const std::vector<double> inv_freq =
      RopeInvFrequencies(config.attn.theta, static_cast<int>(config.attn.rot));
  Placer count(nullptr);
  Bind(config, weights, inv_freq, count, *m);
  if (!count.problems().empty()) return absl::InvalidArgumentError(count.problems());
  absl::StatusOr<DeviceBuffer> storage = DeviceBuffer::Allocate(count.used());
  if (!storage.ok()) return storage.status();
  m->storage = *std::move(storage);
  m->bytes = count.used();
  Placer place(m->storage.as<char>());
  Bind(config, weights, inv_freq, place, *m);
  if (!place.status().ok()) return place.status();
  return m;
}

}  // namespace tandem::cuda
