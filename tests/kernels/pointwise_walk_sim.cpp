// Runs cuda_src/pointwise_common.cuh's grid-stride walks (for_each_element,
// for_each_element_batched, element_walk) on the CPU, every thread of a grid one after the
// other (the walks share nothing between threads), and checks them against the loop they
// replace, a loop over the flat index i = r * cols + c:
//   - every element of a [rows, cols] problem is visited exactly once, each thread's in the
//     order of that loop (i0, i0 + stride, ...), for grids larger and smaller than the problem,
//     cols below, equal to and above the grid's thread count, odd sizes;
//   - the batched walk loads each element before it stores it, once each;
//   - element_walk's (row, column) after k steps equals (i / cols, i % cols) of the flat index
//     at sizes far past 2^32 elements (rows, cols up to 2^31 - 1), where a 32-bit column sum
//     or row would wrap.
// Prints "ok N" (cases checked) or the first failure, exit status 1 then. Used by
// tests/kernels/test_kernels_pointwise_walk.py (g++ -std=c++17 -DPK_HOST_SIM); not part of rnnrt.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

struct Dim3 { unsigned int x = 1, y = 1, z = 1; };
static Dim3 gridDim, blockDim, threadIdx, blockIdx;

#define __device__
#define __forceinline__ inline
#define __global__

#include PW_SOURCE

static int fails = 0;

struct Stop {};   // thrown out of a walk at its first failure: a broken walk may not end

static void fail(const char* what, long long rows, long long cols, unsigned grid,
                 unsigned block, long long detail) {
    if (fails++ == 0)
        std::printf("FAIL %s rows %lld cols %lld grid %u block %u at %lld\n", what, rows, cols,
                    grid, block, detail);
    throw Stop{};
}

// Every thread of a (grid, block) launch over [rows, cols]: each element once, each thread's
// in flat-index order; the batched walk too (loaded once, stored once, load first).
static void exhaustive(int rows, int cols, unsigned grid, unsigned block) {
    const long long n = (long long)rows * cols;
    std::vector<int> seen(n, 0), loaded(n, 0), stored(n, 0);
    gridDim.x = grid;
    blockDim.x = block;
    const long long stride = (long long)grid * block;
    for (unsigned b = 0; b < grid; ++b) {
        for (unsigned t = 0; t < block; ++t) {
            blockIdx.x = b;
            threadIdx.x = t;
            long long expect = (long long)b * block + t;
            for_each_element(rows, cols, [&](long long r, long long c) {
                const long long i = r * cols + c;
                if (c < 0 || c >= cols || r < 0 || r >= rows) fail("outside", rows, cols, grid, block, i);
                else if (i != expect) fail("order", rows, cols, grid, block, i);
                else ++seen[i];
                expect += stride;
            });
            if (expect < n) fail("stopped early", rows, cols, grid, block, expect);
            for_each_element_batched<4>(
                rows, cols,
                [&](long long r, long long c) {
                    const long long i = r * cols + c;
                    if (r >= rows || c >= cols) { fail("batched load outside", rows, cols, grid, block, i); return 0.f; }
                    ++loaded[i];
                    return (float)(i % 1000);
                },
                [&](long long r, long long c, float v) {
                    const long long i = r * cols + c;
                    if (r >= rows || c >= cols) { fail("batched store outside", rows, cols, grid, block, i); return; }
                    if (!loaded[i] || v != (float)(i % 1000)) fail("batched value", rows, cols, grid, block, i);
                    ++stored[i];
                });
        }
    }
    for (long long i = 0; i < n; ++i) {
        if (seen[i] != 1) fail("visits", rows, cols, grid, block, i);
        if (loaded[i] != 1 || stored[i] != 1) fail("batched visits", rows, cols, grid, block, i);
    }
}

// element_walk of thread (b, t) of a [rows, cols] problem for up to `steps` steps against
// i / cols, i % cols of the flat index while i < rows * cols, then the walk's end (r >= rows);
// no overflow: i < 2^62 here.
static void sampled(int rows, int cols, unsigned grid, unsigned block, unsigned b, unsigned t,
                    int steps) {
    gridDim.x = grid;
    blockDim.x = block;
    blockIdx.x = b;
    threadIdx.x = t;
    element_walk w(rows, cols);
    unsigned long long i = (unsigned long long)b * block + t;
    const unsigned long long n = (unsigned long long)rows * (unsigned)cols;
    const unsigned long long stride = (unsigned long long)grid * block;
    for (int k = 0; k < steps; ++k, i += stride, w.next()) {
        if (i >= n) {
            if (w.r < rows) fail("walk past the end", rows, cols, grid, block, (long long)k);
            return;
        }
        if (w.r != (long long)(i / (unsigned)cols) || w.c != (unsigned)(i % (unsigned)cols))
            fail("walk", rows, cols, grid, block, (long long)k);
    }
}

int main() {
    int cases = 0;
    const int sizes[][2] = {{1, 1}, {1, 7}, {7, 1}, {5, 7}, {3, 33}, {33, 3}, {2, 255},
                            {3, 256}, {2, 257}, {4, 1000}, {17, 63}, {1, 1031}, {129, 2}};
    const unsigned grids[][2] = {{1, 1}, {1, 32}, {2, 32}, {3, 64}, {7, 256}, {40, 256}, {1, 256}};
    try {
        for (auto& s : sizes)
            for (auto& g : grids) {
                exhaustive(s[0], s[1], g[0], g[1]);
                ++cases;
            }
    // far past 2^32 elements: columns near 2^31 (c + dc near 2^32), one column (the stride
    // all rows), the registry's grid cap and CUDA's largest grid
    const int big_cols[] = {2147483647, 2147483646, 1073741825, 65537, 2048, 3, 1};
    const unsigned big_grids[][2] = {{4096, 256}, {2147483647u, 1024}, {132, 256}, {1, 1}};
    for (int cols : big_cols)
        for (auto& g : big_grids)
            for (unsigned b : {0u, 1u, g[0] / 2, g[0] - 1})
                for (unsigned t : {0u, g[1] - 1}) {
                    for (int rows : {2147483647, 3, 1}) {
                        sampled(rows, cols, g[0], g[1], b, t, 5000);
                        ++cases;
                    }
                }
    } catch (Stop) {
        return 1;
    }
    std::printf("ok %d\n", cases);
    return 0;
}
