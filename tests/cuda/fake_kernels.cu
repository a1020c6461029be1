// fake_kernels.cu — the kernels of the fake CUDA artifact (tests/cuda/fake_cuda_plan.c).
// The same computation as tests/fixtures_runtime/fake_plan.c, so the x86 and CUDA targets of one
// artifact agree:  y = x + w;  z = y * k[0]  (k[0] == -1 makes scale_k write out of bounds, to test
// how a sticky kernel fault is reported).
//
// Regenerate the committed images (nvcc 13.0):
//   nvcc -cubin -arch=sm_90 -o fake_kernels_sm_90.cubin fake_kernels.cu
//   nvcc -ptx -arch=compute_90 -o fake_kernels.ptx fake_kernels.cu
extern "C" __global__ void add_w(const float* x, const float* w, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + w[i];
}

extern "C" __global__ void scale_k(const float* y, const int* k, float* z, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  int kv = k[0];
  if (kv == -1) {
    if (i == 0) *(volatile float*)(z - (1LL << 40)) = 0.0f;  // an illegal address, on purpose
    return;
  }
  if (i < n) z[i] = y[i] * (float)kv;
}
