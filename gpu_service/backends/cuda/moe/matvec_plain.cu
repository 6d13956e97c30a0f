// Instantiations of the matrix-vector kernels for the float and legacy block formats.
#include "gpu_service/backends/cuda/moe/matvec_impl.cuh"

namespace tandem::cuda {

template cudaError_t LaunchMatVecTyped<kTypeF32>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeF16>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeBF16>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeQ4_0>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeQ8_0>(const MatVecArgs&);

}  // namespace tandem::cuda
