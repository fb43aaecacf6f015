extern "C" __global__ void axpy(float a, const float *x, float *y, int n) { int i = blockIdx.x*blockDim.x+threadIdx.x; if (i < n) y[i] += a*x[i]; }
struct P { float *out; };
extern "C" __global__ void viaStruct(const P *p, int n) { int i = threadIdx.x; if (i < n) p->out[i] = 1; }
extern "C" __global__ void atomicCount(unsigned *c, const float *x, int n) { int i = threadIdx.x; if (i < n && x[i] > 0) atomicAdd(c, 1); }
