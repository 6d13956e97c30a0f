// Instantiations of the matrix-vector kernels for Q2_K and Q3_K.
#include "gpu_service/backends/cuda/moe/matvec_impl.cuh"

namespace tandem::cuda {

template cudaError_t LaunchMatVecTyped<kTypeQ2_K>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeQ3_K>(const MatVecArgs&);

}  // namespace tandem::cuda
