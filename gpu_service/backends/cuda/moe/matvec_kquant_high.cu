// Instantiations of the matrix-vector kernels for Q4_K, Q5_K and Q6_K.
#include "gpu_service/backends/cuda/moe/matvec_impl.cuh"

namespace tandem::cuda {

template cudaError_t LaunchMatVecTyped<kTypeQ4_K>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeQ5_K>(const MatVecArgs&);
template cudaError_t LaunchMatVecTyped<kTypeQ6_K>(const MatVecArgs&);

}  // namespace tandem::cuda
