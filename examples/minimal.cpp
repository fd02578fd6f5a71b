/*
 * minimal.cpp - the minimal libtensr program in C++: the C API used through
 * small RAII owners (unique_ptr with the library's free functions), so every
 * path, early returns included, closes the context and frees the backend.
 * Multiplies two matrices, checks the answer, and shows that an op with
 * mismatched shapes returns nullptr with the error recorded in the context.
 *
 *   c++ minimal.cpp $(pkg-config --cflags --libs libtensr)
 */
#include <libtensr.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace {

struct backend_deleter { void operator()(tsr_backend *b) const { tsr_backend_free(b); } };
struct context_deleter { void operator()(tsr_context *c) const { tsr_context_close(c); } };
using backend_ptr = std::unique_ptr<tsr_backend, backend_deleter>;
using context_ptr = std::unique_ptr<tsr_context, context_deleter>;

const int64_t M = 5, N = 3, K = 7;

double absd(double x) { return x < 0 ? -x : x; }

int fail(const char *what, tsr_status s)
{
    std::fprintf(stderr, "minimal-cpp: %s: %s: %s\n", what, tsr_status_string(s), tsr_last_error());
    return 1;
}

// c[j][i] = sum_k a[i][k] * b[j][k], checked in double precision.
bool correct(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c)
{
    for (int64_t j = 0; j < N; j++)
        for (int64_t i = 0; i < M; i++) {
            double want = 0.0;
            for (int64_t k = 0; k < K; k++) want += double(a[i * K + k]) * b[j * K + k];
            if (absd(c[j * M + i] - want) > 1e-5 * (1.0 + absd(want))) {
                std::fprintf(stderr, "minimal-cpp: c[%lld][%lld] = %g, expected %g\n",
                             (long long)j, (long long)i, c[j * M + i], want);
                return false;
            }
        }
    return true;
}

int multiply(tsr_backend *be)
{
    std::vector<float> a(M * K), b(N * K), c(N * M);
    for (size_t i = 0; i < a.size(); i++) a[i] = float(int(i % 9) - 4) * 0.25f;
    for (size_t i = 0; i < b.size(); i++) b[i] = float(int(i % 4) - 2);
    context_ptr ctx(tsr_context_new(be));
    if (!ctx) return fail("tsr_context_new", TSR_E_NOMEM);
    const int64_t ne_a[2] = {K, M}, ne_b[2] = {K, N};
    tsr_tensor *ta = tsr_input(ctx.get(), TSR_TYPE_F32, 2, ne_a, a.data());
    tsr_tensor *tb = tsr_input(ctx.get(), TSR_TYPE_F32, 2, ne_b, b.data());
    tsr_tensor *tc = tsr_mul_mat(ctx.get(), ta, tb);
    if (!tc) {
        std::fprintf(stderr, "minimal-cpp: graph: %s\n", tsr_context_error(ctx.get()));
        return 1;
    }
    tsr_status s = tsr_compute(ctx.get(), &tc, 1);
    if (s != TSR_OK) return fail("tsr_compute", s);
    s = tsr_tensor_read(tc, c.data(), 0, c.size() * sizeof(float));
    if (s != TSR_OK) return fail("tsr_tensor_read", s);
    if (!correct(a, b, c)) return 1;
    std::printf("c = a x b: [%lld, %lld]: correct\n", (long long)tsr_tensor_ne(tc, 0),
                (long long)tsr_tensor_ne(tc, 1));
    return 0;
}

int mismatch(tsr_backend *be)
{
    context_ptr ctx(tsr_context_new(be));
    if (!ctx) return fail("tsr_context_new", TSR_E_NOMEM);
    const int64_t ne_a[2] = {K, M}, ne_b[2] = {K - 1, N};
    tsr_tensor *ta = tsr_input(ctx.get(), TSR_TYPE_F32, 2, ne_a, nullptr);
    tsr_tensor *tb = tsr_input(ctx.get(), TSR_TYPE_F32, 2, ne_b, nullptr);
    tsr_tensor *tc = tsr_mul_mat(ctx.get(), ta, tb);
    const char *err = tsr_context_error(ctx.get());
    if (tc != nullptr || err == nullptr) {
        std::fprintf(stderr, "minimal-cpp: mismatched shapes were accepted\n");
        return 1;
    }
    std::printf("mismatched shapes rejected: %s\n", err);
    return 0;
}

} // namespace

int main()
{
    std::printf("libtensr %s\n", tsr_version_string());
    tsr_backend_params p;
    tsr_backend_params_init(&p, sizeof p);
    p.n_threads = 2;
    tsr_backend *raw = nullptr;
    tsr_status s = tsr_backend_new(&p, &raw);
    if (s != TSR_OK) return fail("tsr_backend_new", s);
    backend_ptr be(raw);
    int rc = multiply(be.get());
    return rc != 0 ? rc : mismatch(be.get());
}
