// Prefill products Y = X·Wᵀ on the GPU (X: n × cols f32 activations, W: a DeviceMatrix of any GPU
// weight type, Y: n × rows f32), multiplied with cuBLAS. W is either dequantized tile by tile into
// scratch on every call, or, once Prepare has run for it, read from a persistent f16 copy (the
// f16 modes then skip the dequantization altogether).
//
//   kFast:  f16 weights and f16 activations, f32 accumulation (tensor cores).
//   kFastSplit: both split into f16 hi + lo parts, hi·hi + hi·lo + lo·hi (about 3x kFast's
//           arithmetic). Prepared, the three terms are one product over rows laid out as
//           [hi | lo | hi] (weights) and [lo | hi | hi] (activations, gemm.cuh says why lo
//           first), K = 3 · cols, so that the output is written once instead of read and
//           rewritten by two more products.
//   kExact: f32 tiles and activations, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced
//           precision anywhere): the exact mode of docs/MODEL.md §5. Never prepared.
//
// All per-call device memory (the tile, the f16 activations, cuBLAS's workspace) is taken once in
// Create (the FlashInfer "plan"), the prepared copies once in Prepare (at load); Run allocates
// nothing, so it can be captured in a CUDA graph. Not thread-safe: one DenseGemm per stream.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

enum class GemmMode {
  kFast,       // f16 weights and activations, f32 accumulation: one tensor-core product
  kFastSplit,  // each operand as f16 hi + lo: hi·hi + hi·lo + lo·hi, three tensor-core products,
               // close to f32 accuracy (used so that rounding does not flip routing picks)
  kExact,      // f32, no TF32
};

// How the products over prepared copies (RunInput, RunStack, prepared Runs) call cuBLAS:
//   kGemmEx: cublasGemmEx with CUBLAS_GEMM_DEFAULT (cuBLAS's heuristic; at 512 tokens it takes
//            split-K for some shapes, which costs a cublasLt::splitKreduce_kernel launch each);
//   kLt: cublasLt with the heuristic's first algorithm (the same choice through the other API,
//        the A/B baseline for kLtNoSplitK);
//   kLtNoSplitK: cublasLt with the heuristic's best algorithm that has no split-K (one kernel,
//        no reduction launch); the first algorithm when every offered one splits K.
// All three accumulate in f32 over the same f16 operands; the sums' order differs between
// algorithms, so the outputs agree to f32 rounding, not bit for bit.
// NOT yet measured on a GPU (glue512, 2026-12-01): kGemmEx stays the default.
enum class GemmAlgo { kGemmEx, kLt, kLtNoSplitK };

// TANDEM_GEMM_LT=1: kLt; TANDEM_GEMM_NO_SPLITK=1: kLtNoSplitK (wins over TANDEM_GEMM_LT); else kGemmEx.
GemmAlgo GemmAlgoFromEnv();

// Whether DenseGemms created from now on (DenseGemmOptions::split_f8's default) run kFastSplit
// products as one f16 product plus one fp8 correction product (gemm_f8_convert.cuh) instead of
// the three f16 products. On unless TANDEM_GEMM_SPLIT_F8=0 (read once): measured on the H200
// (2026-12-01, q3n-80b, same binary and call, threshold below at its default) prefill 512 15050 ->
// 15147 tok/s and 8192 21999 -> 23170 tok/s, small's fast-mode routing agreement 0.9961 (as with
// f32 dense products; three f16 products 0.9990, one 0.9844). Tests and benchmarks flip it in one
// process before they create the DenseGemm (a plan keeps its choice).
// Whether DenseGemms created from now on (DenseGemmOptions::split_one_product's default) prepare
// kFastSplit copies as [hi | lo | hi] (one product) rather than [hi | lo] (two). On unless
// TANDEM_GEMM_SPLIT_ONE_PRODUCT is set to "" or "0" (EnvSwitchDefaultOn, read once), so that one
// binary can A/B the two forms' speed (two products: 1.8% slower at prefill 512 on the H200).
bool SplitOneProduct();
void SetSplitF8(bool on);
bool SplitF8();
// The fewest weights (rows · cols; a stack's rows for a stack) for which a split_f8 plan makes the
// F8 copy; smaller matrices keep the three f16 products. Measured 2026-12-01 on the H200 (33fc51f,
// prefill_stages_bench --glue, every shape in the F8 form): the fp8 pair wins 1.14-1.24x at 8192
// tokens for the q3n-80b products of >= 2048 x 2048 weights (gdn qkv, z, out, attn q, o) and is
// about even for them at 512, but loses 4-47% for every smaller one (router, attn k / v, gdn ba,
// the shared expert's stack 1032 x 2048 and down 2048 x 512), where the second GEMM launch and
// the conversion outweigh the arithmetic. TANDEM_GEMM_SPLIT_F8_MIN_WEIGHTS (read once), default
// 2048 · 2048; the default of DenseGemmOptions::split_f8_min_weights made from now on.
void SetSplitF8MinWeights(int64_t weights);
int64_t SplitF8MinWeights();

// Which terms the fp8 correction of a split_f8 product computes (TANDEM_GEMM_F8_TERMS, read once):
//   kActivationLo (unset or "xlo", the default): x_lo·w_hi only (K = cols): the activations' f16
//       rounding corrected, the weights' (~2^-12 relative) left;
//   kBoth ("both"): x_lo·w_hi + x_hi·w_lo (K = 2 · cols), close to f32;
//   kWeightLo ("wlo"): x_hi·w_lo only: the other way round.
// Measured on the H200 (2026-12-02, docs/PERF.md "Twelfth session"): one term makes the 8192-token
// q3n-80b prefill 5.8% faster (the fp8 product's arithmetic halved) with the same fast-mode routing
// agreement over eight prompts (small 0.9928 against 0.9926 with both terms; docs/VALIDATION.md).
// Its kernel error: 2.1e-4 relative L2 against f64 on Q8_0 weights (both terms 1.0e-5, one f16
// product 2.9e-4).
enum class F8Terms { kBoth, kActivationLo, kWeightLo };
F8Terms F8TermsFromEnv();

struct DenseGemmOptions {
  GemmMode mode = GemmMode::kFast;
  int64_t max_n = 8192;                   // most activation rows in one Run
  int64_t max_cols = 8192;                // widest input dimension
  int64_t tile_bytes = 256ll << 20;       // scratch for one dequantized weight tile
  int64_t workspace_bytes = 32ll << 20;   // cuBLAS workspace
  // Layout of a matrix prepared for kFastSplit: true: rows [hi | lo | hi], 6 bytes per weight,
  // one product per Run; false: rows [hi | lo], 4 bytes per weight, two products per Run
  // ([hi | lo]·[hi | hi], then hi·lo added onto the output).
  bool split_one_product = SplitOneProduct();
  GemmAlgo prepared_algo = GemmAlgoFromEnv();  // products over prepared copies (see GemmAlgo)
  // kFastSplit over prepared copies as hi·hi in f16 (K = cols, through prepared_algo) plus
  // [x_lo8 | x_hi8]·[w_hi8 | w_lo8] in fp8 e4m3 (K = 2 · cols, cublasLt, f32 output; by default
  // only its x_lo8·w_hi8 half, f8_terms): 4 bytes per weight ([hi] f16 rows and [hi8 | lo8] e4m3
  // rows), relative L2 ~1e-5 against f64 with both terms (~0.7x one f16 product's with one) instead
  // of ~1.3e-6 (one f16 product: ~3e-4), for matrices of at least split_f8_min_weights weights (and
  // cols a multiple of 8); the others keep the three f16 products. The activations stay [lo | hi | hi]
  // split rows (see F16Input); their fp8 rows go to a buffer of their own. Unprepared Runs stay
  // tiled f16.
  bool split_f8 = SplitF8();
  int64_t split_f8_min_weights = SplitF8MinWeights();
  F8Terms f8_terms = F8TermsFromEnv();  // which terms the fp8 correction computes (see F8Terms)
};

class DenseGemm {
 public:
  static absl::StatusOr<std::unique_ptr<DenseGemm>> Create(const DenseGemmOptions& options);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // y (n × w.rows, row stride w.rows) = x (n × w.cols, row stride w.cols) · Wᵀ on `stream`.
  // InvalidArgument when n or w.cols exceed the plan or w's type is not a GPU type.
  absl::Status Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream) {
    return Run(w, x, n, y, stream, options_.mode);
  }
  // The same in a chosen precision: a kFast or kFastSplit plan runs any mode (the router's logits
  // exactly: their rounding would change which experts are picked); a kExact plan has no f16
  // scratch, so it refuses the others.
  // A Run of w (same data pointer, type and shape) in kFast, or in kFastSplit when prepared for
  // it, reads the prepared copy (see Prepare); other Runs dequantize tile by tile.
  absl::Status Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream, GemmMode mode);

  // Makes the persistent f16 copy of w that Runs in `mode` read instead of dequantizing w on every
  // call: hi only for kFast (2 bytes per weight), hi and lo for kFastSplit (6 or 4 bytes per weight,
  // DenseGemmOptions::split_one_product; such a copy serves kFast Runs too). Call at load time,
  // not during graph capture: it allocates, and waits on `stream` for the scale (a power of two
  // that puts max |w| at 2^14, undone exactly through alpha: weights beyond f16's range stay
  // finite and small ones keep a normal lo; on Q8_0 / f32 weights of std 0.02 it changed the
  // split's error by < 5%, GpuDenseGemmStudy).
  // Cached by w.data: the caller keeps the weights unchanged while this DenseGemm lives (a matrix
  // with the same pointer but another type or shape replaces the entry). Preparing again is a
  // no-op, except that a kFast copy is replaced by a kFastSplit one. kExact: nothing to prepare
  // (OK). InvalidArgument for an unsupported type or shape or a kExact plan with an f16 mode;
  // the CUDA error of a failed allocation (nothing is kept then).
  absl::Status Prepare(const DeviceMatrix& w, GemmMode mode, cudaStream_t stream = nullptr);
  absl::Status Prepare(const DeviceMatrix& w, cudaStream_t stream = nullptr) { return Prepare(w, options_.mode, stream); }

  // Device bytes the copy of w prepared for `mode` takes under `options`.
  static int64_t PreparedBytes(const DeviceMatrix& w, GemmMode mode, const DenseGemmOptions& options);
  // Device bytes held by all prepared copies; whether a Run of w in `mode` would read one.
  int64_t prepared_bytes() const { return prepared_bytes_; }
  bool IsPrepared(const DeviceMatrix& w, GemmMode mode) const { return FindPrepared(w, mode) != nullptr; }

  GemmMode mode() const { return options_.mode; }

  // Activations in the f16 layout a prepared product reads ([f16(x)] rows for kFast, [lo | hi | hi]
  // rows of 3 · cols for kFastSplit): made once by ConvertInput for several products of the same
  // input, or written straight into input_scratch() by a fused kernel (LaunchSiluMulToF16Rows),
  // so that the f32 → f16 pass runs once instead of once per product.
  // In a split_f8 plan, the kFastSplit rows an F8 product reads must lie in input_scratch(): the
  // first F8 product over them derives their fp8 rows (gemm_f8_convert.cuh: the max |hi| and the
  // fp8 rows, two launches, no host sync, the split rows untouched); later products of the same
  // rows reuse them until the scratch is written again (input_scratch(), ConvertInput of other
  // rows, SetConverted, ForgetConverted).
  struct F16Input {
    const uint16_t* data = nullptr;
    int64_t n = 0, cols = 0;
    GemmMode mode = GemmMode::kFast;
    // Row stride in f16 values for a kFast input; 0: cols (3 · cols: HiThirdsOf's). kFastSplit
    // inputs: always 3 · cols.
    int64_t ld = 0;
  };
  // The hi thirds of kFastSplit rows (gemm.cuh's split rows) as a kFast input, with no conversion.
  static F16Input HiThirdsOf(const F16Input& split);
  // Converts x (n × cols f32) into input_scratch(); valid until the next Run / ConvertInput /
  // write into the scratch. InvalidArgument for kExact, an exact plan, or n / cols beyond the plan.
  absl::StatusOr<F16Input> ConvertInput(const float* x, int64_t n, int64_t cols, GemmMode mode, cudaStream_t stream);
  // The activation scratch: room for max_n · max_cols · 3 f16 values (nullptr in a kExact plan).
  // The caller is about to write it: whatever SetConverted said about it no longer holds.
  uint16_t* input_scratch() {
    ForgetConverted();
    return x_f16_.as<uint16_t>();
  }
  bool split_f8() const { return options_.split_f8; }
  // Says that input_scratch() now holds x (n × cols f32, unchanged since) converted for `mode`,
  // written by a fused kernel (LaunchInjectRmsNormF16): until the scratch is written again
  // (input_scratch(), a ConvertInput of anything else, a Run that converts, ForgetConverted),
  // ConvertInput of the same (x, n, cols, mode) returns it without a launch, and so do the Runs of
  // matrices prepared for `mode` over x. The caller calls ForgetConverted before x's values change.
  void SetConverted(const float* x, int64_t n, int64_t cols, GemmMode mode) {
    converted_ = {x, n, cols, mode};
    f8_rows_ = {};
  }
  void ForgetConverted() {
    converted_ = {};
    f8_rows_ = {};
  }
  // Whether the scratch holds x converted for mode (tests).
  bool HoldsConverted(const float* x, int64_t n, int64_t cols, GemmMode mode) const {
    return x != nullptr && converted_.x == x && converted_.n == n && converted_.cols == cols && converted_.mode == mode;
  }
  // y (n × w.rows) = in · Wᵀ from the converted input; w must be prepared for in.mode
  // (FailedPrecondition otherwise: the caller keeps its f32 path for unprepared matrices).
  absl::Status RunInput(const DeviceMatrix& w, const F16Input& in, float* y, cudaStream_t stream);

  // Prepares matrices of equal cols as ONE copy, their rows stacked in order and zero rows up to a
  // multiple of 8, under one scale, so that RunStack gives all their products in one cuBLAS call
  // (row t of y: [y_0 | y_1 | … | zeros], StackRows values). Every part also counts as prepared on
  // its own (Run / RunInput read its rows of the stack), so the stack replaces separate copies.
  // The shared scale costs nothing measurable: a part whose max |w| is 2^-k of the stack's keeps
  // lo halves with an absolute quantum of 2^-39 of the stack's max (f16 subnormals), far below the
  // split's 2^-22 relative precision; parts more than 2^12 apart are refused anyway. Returns the
  // stack's rows; FailedPrecondition (nothing kept) when a part is already prepared, differs in
  // cols, or the scales are too far apart; InvalidArgument as Prepare.
  absl::StatusOr<int64_t> PrepareStack(std::span<const DeviceMatrix* const> parts, GemmMode mode,
                                       cudaStream_t stream = nullptr);
  // y (n × StackRows, row stride StackRows) = in · [W_0; W_1; …]ᵀ. parts exactly as prepared.
  absl::Status RunStack(std::span<const DeviceMatrix* const> parts, const F16Input& in, float* y, cudaStream_t stream);
  // The stack's rows (with padding) if parts were prepared as one stack, else 0.
  int64_t StackRows(std::span<const DeviceMatrix* const> parts) const;

 private:
  // A prepared copy: `copies` f16 values per weight per row (1: [hi], 2: [hi | lo], 3: [hi | lo | hi]),
  // every value scaled by 1 / alpha. A part of a stack shares the stack's buffer from row_offset.
  // An F8 copy (split_f8) has copies 1 (the hi rows of all rows_total + 16 rows) followed, from
  // byte f8_offset, by as many rows of 2 · cols e4m3 values and, from byte scale_offset, the device
  // float that cublasLt's A scale pointer reads (alpha / s_w).
  struct Prepared {
    DeviceMatrix source;
    std::shared_ptr<DeviceBuffer> data;
    int64_t row_offset = 0;
    int64_t stack_rows = 0;            // rows of the whole stack (0: not in a stack)
    const void* stack_first = nullptr;  // data of the stack's first part
    int copies = 0;
    float alpha = 1.0f;
    bool f8 = false;
    int64_t f8_offset = 0, scale_offset = 0;
    const uint16_t* weights() const { return data->as<uint16_t>() + row_offset * copies * source.cols; }
    const uint8_t* weights8() const { return data->as<uint8_t>() + f8_offset + row_offset * 2 * source.cols; }
    const float* a_scale() const { return reinterpret_cast<const float*>(data->as<uint8_t>() + scale_offset); }
  };

  explicit DenseGemm(const DenseGemmOptions& options) : options_(options) {}
  const Prepared* FindPrepared(const DeviceMatrix& w, GemmMode mode) const;
  absl::Status CheckInput(const F16Input& in, int64_t cols) const;
  // One cuBLAS product over the prepared rows (rows of them) and converted activations, on the
  // stream the cuBLAS handle is set to.
  absl::Status Gemm16(const Prepared& p, int64_t rows, const F16Input& in, float* y, int64_t ldy,
                      cudaStream_t stream);
  // One product through cublasLt (options_.prepared_algo kLt / kLtNoSplitK): D = alpha·Aᵀ·B + beta·D,
  // A k × m (lda), B k × n (ldb), D m × n f32 (ldd); the plan per shape made on first use.
  absl::Status GemmLt(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                      const uint16_t* b, int64_t ldb, float beta, float* d, int64_t ldd, cudaStream_t stream);
  // InvalidArgument naming `who` when w's type, shape or width cannot be prepared.
  absl::Status CheckPreparable(const DeviceMatrix& w, const char* who) const;
  absl::Status RunPrepared(const Prepared& p, const float* x, int64_t n, float* y, cudaStream_t stream,
                           GemmMode mode);
  absl::StatusOr<float> MaxAbs(const DeviceMatrix& w, cudaStream_t stream);
  // gemm_f8.cc. The F8 copy of parts (equal cols, stacked in order, total_rows >= their rows, the
  // rest zero) under the prepared scale 2^e (max_abs: the parts' largest |w|); the caller fills the
  // Prepared entries (copies 1, f8, the offsets below). Waits on stream.
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> MakeF8Copy(std::span<const DeviceMatrix* const> parts,
                                                           int64_t total_rows, int e, float max_abs,
                                                           cudaStream_t stream);
  static void SetF8Offsets(Prepared& p, int64_t total_rows);
  // Whether a kFastSplit copy takes the F8 form: split_f8, cols % 8 == 0 (fp8 GEMMs need K = 2 · cols
  // and the strides in 16-byte multiples) and rows · cols >= split_f8_min_weights.
  // (rows: the copy's rows, a stack's for a stack.)
  static bool UsesF8(GemmMode mode, int64_t rows, int64_t cols, const DenseGemmOptions& options) {
    return mode == GemmMode::kFastSplit && options.split_f8 && cols % 8 == 0 &&
           rows * cols >= options.split_f8_min_weights;
  }
  // Bytes of an F8 copy of total_rows rows of cols: 16 more zero rows after each part (a padded
  // fp8 product may read up to 15 rows past a part) and the A scale.
  static int64_t F8CopyBytes(int64_t total_rows, int64_t cols) { return (total_rows + 16) * cols * 4 + 256; }
  // Makes sure x8_ holds the fp8 rows of the split rows at data (the scratch; see F16Input).
  absl::Status EnsureF8Rows(const uint16_t* data, int64_t n, int64_t cols, cudaStream_t stream);
  // The F8 product: y (rows × n, ldy) = fp8 correction (beta 0), then + hi·hi (f16, beta 1).
  absl::Status GemmF8(const Prepared& p, int64_t rows, const F16Input& in, float* y, int64_t ldy,
                      cudaStream_t stream);
  void Erase(const void* data);  // drops w.data's entry (and its bytes once no part holds them)
  absl::Status RunTiled(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                        GemmMode mode);

  // What SetConverted said the scratch holds (x nullptr: nothing known).
  struct Converted {
    const float* x = nullptr;
    int64_t n = 0, cols = 0;
    GemmMode mode = GemmMode::kExact;
  };
  // A cublasLt plan for one shape (m, n, k, lda, ldb, ldd, beta == 0) and the alignments (bytes,
  // up to 256) of the A, B and D pointers it may take (the heuristic assumes 256 unless told).
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~LtPlan();
  };
  using LtKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t>;
  absl::StatusOr<const LtPlan*> FindLtPlan(const LtKey& key);
  // cublasLt's heuristic for plan's descriptors (the plan's workspace and the pointers' alignments
  // in bytes): up to `want` results, *found of them filled. Shared by FindLtPlan and FindF8Plan.
  cublasStatus_t LtHeuristic(const LtPlan& plan, uint32_t align_a, uint32_t align_b, uint32_t align_d, int want,
                             cublasLtMatmulHeuristicResult_t* results, int* found) const;
  // The fp8 plan (e4m3 A and B, f32 D, B scale pointer set) for a key of the same form.
  absl::StatusOr<const LtPlan*> FindF8Plan(const LtKey& key);

  DenseGemmOptions options_;
  Converted converted_;
  // The split rows in the scratch whose fp8 rows x8_ holds (data nullptr: none).
  struct F8Rows {
    const uint16_t* data = nullptr;
    int64_t n = 0, cols = 0;
  };
  F8Rows f8_rows_;
  // split_f8: the activations' max |hi| bits and the conversion's block counter (unsigned, 0
  // between calls), and from byte 16 the B scale (float) the fp8 product reads.
  DeviceBuffer f8_state_;
  DeviceBuffer x8_;  // split_f8: the activations' fp8 rows, max_n × 2 · max_cols bytes
  std::map<LtKey, std::unique_ptr<LtPlan>> f8_plans_;
  cublasLtHandle_t lt_ = nullptr;
  std::map<LtKey, std::unique_ptr<LtPlan>> lt_plans_;
  std::unordered_map<const void*, Prepared> prepared_;
  int64_t prepared_bytes_ = 0;
  DeviceBuffer max_bits_;  // one unsigned, Prepare's max |w|
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer tile_;
  DeviceBuffer x_f16_;
  DeviceBuffer workspace_;
};

// Turns a cuBLAS status into absl::Status (InternalError naming the call).
absl::Status CublasStatus(cublasStatus_t status, const char* what);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
