/*
 * tests/fake_libcuda.c — a stand-in for the NVIDIA driver's libcuda.so.1 that supports only CUDA 11.8
 * (cuDriverGetVersion 11080) and starts nothing, built as fake_driver/libcuda.so.1 in a CUDA build. With
 * LD_LIBRARY_PATH pointing at it, test_cuda_host checks the message of a machine whose driver is older than
 * the build's CUDA runtime (the runtime refuses the driver, then src/device/cuda.c asks the driver itself).
 */
int cuDriverGetVersion(int *version);
int cuInit(unsigned int flags);

int cuDriverGetVersion(int *version) {
    if (!version) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *version = 11080;
    return 0;
}

int cuInit(unsigned int flags) {
    (void)flags;
    return 35; /* CUDA_ERROR_INSUFFICIENT_DRIVER */
}
