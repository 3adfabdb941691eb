// Mixture-of-experts kernels against a float64 reference written here: the
// routing (top-1 and top-2, softmax and sigmoid with a bias, ties, the
// capacity cut and its dropped choices, the aux and z losses), and a whole
// routed layer (router -> gather -> expert MLPs -> combine) whose analytic
// gradients are checked against central differences of the reference.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

using namespace apiary;
using namespace apiary::testing;
namespace k = apiary::kernels;

namespace {

// float rounding of O(1) values through a few dozen operations, well
// below what a wrong term (a missing factor 1/N, a sign) produces.
constexpr double kFwdTol = 1e-5;
// Float gradients against fp64 differences of the same function.
constexpr double kGradTol = 2e-4;

struct RefRoute {
    std::vector<double> probs, gate;
    std::vector<int> expert, slot;  // slot: admission position within the expert, -1 dropped
    std::vector<int64_t> routed, dropped, kept;
    double aux = 0, z = 0;
};

// The routing rule as the header states it, in float64.
RefRoute ref_route(const std::vector<double>& logits, const std::vector<double>& bias, int N, int E,
                   int K, bool sigmoid, int64_t capacity) {
    RefRoute r;
    r.probs.resize(size_t(N * E));
    r.gate.resize(size_t(N * K));
    r.expert.resize(size_t(N * K));
    r.slot.resize(size_t(N * K));
    r.routed.assign(size_t(E), 0);
    r.dropped.assign(size_t(E), 0);
    r.kept.assign(size_t(E), 0);
    for (int t = 0; t < N; ++t) {
        const double* l = &logits[size_t(t * E)];
        double m = l[0], s = 0;
        for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
        for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
        const double lse = m + std::log(s);
        r.z += lse * lse / N;
        for (int e = 0; e < E; ++e) {
            r.probs[size_t(t * E + e)] = sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - lse);
        }
        std::vector<bool> taken(size_t(E), false);
        double sum = 0;
        for (int j = 0; j < K; ++j) {
            int best = -1;
            double bs = 0;
            for (int e = 0; e < E; ++e) {
                if (taken[size_t(e)]) continue;
                const double sc =
                    sigmoid ? r.probs[size_t(t * E + e)] + (bias.empty() ? 0 : bias[size_t(e)])
                            : l[e];
                if (best < 0 || sc > bs) best = e, bs = sc;
            }
            taken[size_t(best)] = true;
            r.expert[size_t(t * K + j)] = best;
            sum += r.probs[size_t(t * E + best)];
        }
        for (int j = 0; j < K; ++j) {
            const double p = r.probs[size_t(t * E + r.expert[size_t(t * K + j)])];
            r.gate[size_t(t * K + j)] = K == 1 ? p : p / sum;
        }
    }
    for (int j = 0; j < K; ++j) {
        for (int t = 0; t < N; ++t) {
            const int e = r.expert[size_t(t * K + j)];
            r.routed[size_t(e)]++;
            if (r.kept[size_t(e)] < capacity) {
                r.slot[size_t(t * K + j)] = int(r.kept[size_t(e)]++);
            } else {
                r.slot[size_t(t * K + j)] = -1;
                r.gate[size_t(t * K + j)] = 0;
                r.dropped[size_t(e)]++;
            }
        }
    }
    for (int e = 0; e < E; ++e) {
        double P = 0;
        for (int t = 0; t < N; ++t) {
            double norm = 1;
            if (sigmoid) {
                norm = 0;
                for (int i = 0; i < E; ++i) norm += r.probs[size_t(t * E + i)];
            }
            P += r.probs[size_t(t * E + e)] / norm / N;
        }
        r.aux += E * (double(r.routed[size_t(e)]) / (N * K)) * P;
    }
    return r;
}

// The kernels' routing outputs, with owned storage.
struct Route {
    std::vector<float> probs, gate;
    std::vector<int32_t> expert, slot, token_of;
    std::vector<int64_t> offsets, routed, dropped;
    k::MoeLosses losses;
    k::MoeRouteOut out() {
        return {probs.data(),   expert.data(), gate.data(),   slot.data(),
                offsets.data(), token_of.data(), routed.data(), dropped.data()};
    }
    Route(const std::vector<float>& logits, const float* bias, int N, int E, int K, bool sigmoid,
          int64_t capacity)
        : probs(size_t(N * E)),
          gate(size_t(N * K)),
          expert(size_t(N * K)),
          slot(size_t(N * K)),
          token_of(size_t(N * K)),
          offsets(size_t(E + 1)),
          routed(size_t(E)),
          dropped(size_t(E)) {
        losses = k::moe_route_forward(out(), logits.data(), bias, N, E, K,
                                      sigmoid ? k::MoeRouter::sigmoid : k::MoeRouter::softmax,
                                      capacity);
    }
};

void expect_route_matches(const Route& got, const RefRoute& ref, int N, int E, int K) {
    EXPECT_EQ(got.expert, std::vector<int32_t>(ref.expert.begin(), ref.expert.end()));
    EXPECT_EQ(got.routed, ref.routed);
    EXPECT_EQ(got.dropped, ref.dropped);
    EXPECT_LT(rel_error(got.probs, ref.probs), kFwdTol);
    EXPECT_LT(rel_error(got.gate, ref.gate), kFwdTol);
    EXPECT_NEAR(got.losses.aux, ref.aux, kFwdTol * ref.aux);
    EXPECT_NEAR(got.losses.z, ref.z, kFwdTol * ref.z + 1e-12);
    // Rows are grouped by expert in admission order; each kept choice names
    // its token.
    for (int e = 0; e < E; ++e) {
        EXPECT_EQ(got.offsets[size_t(e + 1)] - got.offsets[size_t(e)], ref.kept[size_t(e)]) << e;
    }
    for (int t = 0; t < N; ++t) {
        for (int j = 0; j < K; ++j) {
            const int s = got.slot[size_t(t * K + j)], rs = ref.slot[size_t(t * K + j)];
            if (rs < 0) {
                EXPECT_EQ(s, -1) << "token " << t << " choice " << j;
                continue;
            }
            const int e = ref.expert[size_t(t * K + j)];
            EXPECT_EQ(s, got.offsets[size_t(e)] + rs) << "token " << t << " choice " << j;
            EXPECT_EQ(got.token_of[size_t(s)], t);
        }
    }
}

TEST(MoeRouting, SoftmaxTop2MatchesReference) {
    const int N = 13, E = 5, K = 2;
    const auto logits = random_vec(size_t(N * E), 11);
    const Route r(logits, nullptr, N, E, K, false, N);
    expect_route_matches(r, ref_route(to_f64(logits), {}, N, E, K, false, N), N, E, K);
    int64_t dropped = 0;
    for (auto d : r.dropped) dropped += d;
    EXPECT_EQ(dropped, 0);
    EXPECT_EQ(r.offsets[E], N * K);
}

TEST(MoeRouting, CapacityDropsLaterChoicesAndCountsThem) {
    const int N = 17, E = 4, K = 2;
    // A skewed router: expert 2 is everyone's favourite.
    auto logits = random_vec(size_t(N * E), 12, 0.5f);
    for (int t = 0; t < N; ++t) logits[size_t(t * E + 2)] += 3.0f;
    const int64_t cap = k::moe_capacity(N, E, K, 1.0, false);
    EXPECT_EQ(cap, 9);  // ceil(1.0 * 17 * 2 / 4)
    const Route r(logits, nullptr, N, E, K, false, cap);
    const auto ref = ref_route(to_f64(logits), {}, N, E, K, false, cap);
    expect_route_matches(r, ref, N, E, K);
    EXPECT_EQ(r.routed[2], N);
    EXPECT_EQ(r.dropped[2], N - cap);  // the first 9 tokens keep it
    for (int t = 0; t < N; ++t) EXPECT_EQ(r.slot[size_t(t * K)] >= 0, t < cap) << t;
    EXPECT_EQ(k::moe_capacity(N, E, K, 1.0, true), N);
}

TEST(MoeRouting, TiesGoToTheLowerExpert) {
    const int N = 3, E = 6, K = 2;
    std::vector<float> logits(size_t(N * E), 0.0f);  // token 0: all tied
    for (int e = 0; e < E; ++e) logits[size_t(E + e)] = (e == 2 || e == 4) ? 1.0f : 0.0f;
    for (int e = 0; e < E; ++e) logits[size_t(2 * E + e)] = e == 5 ? 2.0f : (e >= 3 ? 1.0f : 0.0f);
    const Route r(logits, nullptr, N, E, K, false, N);
    EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2, 4, 5, 3}));
    EXPECT_FLOAT_EQ(r.gate[0], 0.5f);
    EXPECT_FLOAT_EQ(r.gate[1], 0.5f);
    expect_route_matches(r, ref_route(to_f64(logits), {}, N, E, K, false, N), N, E, K);
}

TEST(MoeRouting, Top1GateIsTheProbability) {
    const int N = 9, E = 3, K = 1;
    const auto logits = random_vec(size_t(N * E), 13);
    const Route r(logits, nullptr, N, E, K, false, 2);
    expect_route_matches(r, ref_route(to_f64(logits), {}, N, E, K, false, 2), N, E, K);
    for (int t = 0; t < N; ++t) {
        if (r.slot[size_t(t)] < 0) continue;
        EXPECT_FLOAT_EQ(r.gate[size_t(t)], r.probs[size_t(t * E + r.expert[size_t(t)])]);
    }
}

TEST(MoeRouting, SigmoidBiasSteersTheChoiceButNotTheGates) {
    const int N = 10, E = 4, K = 2;
    const auto logits = random_vec(size_t(N * E), 14);
    const std::vector<float> none(size_t(E), 0.0f), bias = {0.0f, 0.0f, 0.0f, 5.0f};
    const Route plain(logits, none.data(), N, E, K, true, N);
    const Route biased(logits, bias.data(), N, E, K, true, N);
    expect_route_matches(biased, ref_route(to_f64(logits), to_f64(bias), N, E, K, true, N), N, E,
                         K);
    expect_route_matches(plain, ref_route(to_f64(logits), {}, N, E, K, true, N), N, E, K);
    for (int t = 0; t < N; ++t) {
        EXPECT_EQ(biased.expert[size_t(t * K)], 3) << t;  // the bias wins every first choice
        // Gates are the chosen sigmoid scores normalised, the bias left out.
        const float s0 = biased.probs[size_t(t * E + biased.expert[size_t(t * K)])];
        const float s1 = biased.probs[size_t(t * E + biased.expert[size_t(t * K + 1)])];
        EXPECT_NEAR(biased.gate[size_t(t * K)], s0 / (s0 + s1), 1e-6);
    }
    EXPECT_NE(plain.expert, biased.expert);
}

TEST(MoeRouting, BalancedRouterHasAuxLossOne) {
    // Every token scores every expert equally in P, and the choices spread
    // evenly (token t's favourite is t mod E): aux = E * sum (1/E)(1/E) = 1.
    const int N = 8, E = 4, K = 1;
    std::vector<float> logits(size_t(N * E), 0.0f);
    for (int t = 0; t < N; ++t) logits[size_t(t * E + t % E)] = 1e-4f;
    const Route r(logits, nullptr, N, E, K, false, N);
    EXPECT_NEAR(r.losses.aux, 1.0, 1e-4);
    const double lse = std::log(double(E));
    EXPECT_NEAR(r.losses.z, lse * lse, 1e-3);
}

// ---- a whole routed layer ----

struct LayerCase {
    int N, C, E, K, F;
    bool sigmoid;
    double capacity_factor;
    bool dropless;
    float aux_coef, z_coef;
};

double gelu(double x) {
    const double c = std::sqrt(2.0 / M_PI);
    return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// Sizes of the flat fp64 parameter vector: x, router, W1 per expert, W2 per expert.
struct Offsets {
    size_t x, wr, w1, w2, total;
};
Offsets offsets_of(const LayerCase& c) {
    Offsets o;
    o.x = 0;
    o.wr = o.x + size_t(c.N * c.C);
    o.w1 = o.wr + size_t(c.E * c.C);
    o.w2 = o.w1 + size_t(c.E * c.F * c.C);
    o.total = o.w2 + size_t(c.E * c.C * c.F);
    return o;
}

// sum(wout * y) + aux_coef aux + z_coef z of the layer in float64.
double ref_layer(const LayerCase& c, const std::vector<double>& v, const std::vector<double>& wout,
                 const std::vector<double>& bias) {
    const Offsets o = offsets_of(c);
    const int N = c.N, C = c.C, E = c.E, K = c.K, F = c.F;
    std::vector<double> logits(size_t(N * E));
    for (int t = 0; t < N; ++t) {
        for (int e = 0; e < E; ++e) {
            double s = 0;
            for (int i = 0; i < C; ++i) s += v[o.x + size_t(t * C + i)] * v[o.wr + size_t(e * C + i)];
            logits[size_t(t * E + e)] = s;
        }
    }
    const int64_t cap = k::moe_capacity(N, E, K, c.capacity_factor, c.dropless);
    const RefRoute r = ref_route(logits, bias, N, E, K, c.sigmoid, cap);
    double loss = c.aux_coef * r.aux + c.z_coef * r.z;
    std::vector<double> h(static_cast<size_t>(F));
    for (int t = 0; t < N; ++t) {
        for (int j = 0; j < K; ++j) {
            if (r.slot[size_t(t * K + j)] < 0) continue;
            const int e = r.expert[size_t(t * K + j)];
            const double g = r.gate[size_t(t * K + j)];
            for (int f = 0; f < F; ++f) {
                double s = 0;
                for (int i = 0; i < C; ++i) {
                    s += v[o.x + size_t(t * C + i)] * v[o.w1 + size_t((e * F + f) * C + i)];
                }
                h[size_t(f)] = gelu(s);
            }
            for (int i = 0; i < C; ++i) {
                double s = 0;
                for (int f = 0; f < F; ++f) s += h[size_t(f)] * v[o.w2 + size_t((e * C + i) * F + f)];
                loss += wout[size_t(t * C + i)] * g * s;
            }
        }
    }
    return loss;
}

// The same layer through the kernels; returns the loss and the gradient of
// every input in the layout of offsets_of.
double kernel_layer(const LayerCase& c, const std::vector<float>& v, const std::vector<float>& wout,
                    const float* bias, std::vector<float>* grad) {
    const Offsets o = offsets_of(c);
    const int N = c.N, C = c.C, E = c.E, K = c.K, F = c.F;
    const float* x = v.data() + o.x;
    std::vector<float> logits(size_t(N * E));
    k::linear_forward(logits.data(), x, v.data() + o.wr, nullptr, N, C, E);
    const int64_t cap = k::moe_capacity(N, E, K, c.capacity_factor, c.dropless);
    Route r(logits, bias, N, E, K, c.sigmoid, cap);
    const int64_t M = r.offsets[size_t(E)];
    std::vector<const float*> W1(static_cast<size_t>(E)), W2(static_cast<size_t>(E));
    grad->assign(o.total, 0.0f);
    std::vector<float*> dW1(static_cast<size_t>(E)), dW2(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        W1[size_t(e)] = v.data() + o.w1 + size_t(e * F * C);
        W2[size_t(e)] = v.data() + o.w2 + size_t(e * C * F);
        dW1[size_t(e)] = grad->data() + o.w1 + size_t(e * F * C);
        dW2[size_t(e)] = grad->data() + o.w2 + size_t(e * C * F);
    }
    std::vector<float> xg(size_t(M * C)), hpre(size_t(M * F)), hact(size_t(M * F)),
        ye(size_t(M * C)), y(size_t(N * C), 0.0f);
    k::moe_gather(xg.data(), x, r.token_of.data(), M, C);
    k::grouped_linear_forward(hpre.data(), xg.data(), W1.data(), r.offsets.data(), E, C, F);
    k::gelu_forward(hact.data(), hpre.data(), M * F);
    k::grouped_linear_forward(ye.data(), hact.data(), W2.data(), r.offsets.data(), E, F, C);
    k::moe_combine_forward(y.data(), ye.data(), r.slot.data(), r.gate.data(), N, K, C);
    double loss = c.aux_coef * r.losses.aux + c.z_coef * r.losses.z;
    for (size_t i = 0; i < y.size(); ++i) loss += double(wout[i]) * y[i];

    std::vector<float> dye(size_t(M * C)), dgate(size_t(N * K)), dact(size_t(M * F)),
        dxg(size_t(M * C)), dlogits(size_t(N * E)), dx2(size_t(N * C));
    k::moe_combine_backward(dye.data(), dgate.data(), wout.data(), ye.data(), r.slot.data(),
                            r.gate.data(), N, K, C);
    k::grouped_linear_backward(dact.data(), dW2.data(), dye.data(), hact.data(), W2.data(),
                               r.offsets.data(), E, F, C);
    k::gelu_backward(dact.data(), hpre.data(), dact.data(), M * F);
    k::grouped_linear_backward(dxg.data(), dW1.data(), dact.data(), xg.data(), W1.data(),
                               r.offsets.data(), E, C, F);
    float* dx = grad->data() + o.x;
    k::moe_gather_backward(dx, dxg.data(), r.slot.data(), N, K, C);
    k::moe_route_backward(dlogits.data(), dgate.data(), logits.data(), r.probs.data(),
                          r.expert.data(), r.routed.data(), N, E, K,
                          c.sigmoid ? k::MoeRouter::sigmoid : k::MoeRouter::softmax, c.aux_coef,
                          c.z_coef);
    k::linear_backward(dx2.data(), grad->data() + o.wr, nullptr, dlogits.data(), x,
                       v.data() + o.wr, N, C, E);
    for (size_t i = 0; i < dx2.size(); ++i) dx[i] += dx2[i];
    return loss;
}

void check_layer(const LayerCase& c, uint64_t seed, const std::vector<float>& bias = {}) {
    const Offsets o = offsets_of(c);
    auto v = random_vec(o.total, seed, 0.5f);
    const auto wout = random_vec(size_t(c.N * c.C), seed + 1);
    std::vector<float> grad;
    const double loss = kernel_layer(c, v, wout, bias.empty() ? nullptr : bias.data(), &grad);
    const auto f = [&](const std::vector<double>& x) {
        return ref_layer(c, x, to_f64(wout), to_f64(bias));
    };
    const double ref = f(to_f64(v));
    EXPECT_NEAR(loss, ref, kFwdTol * std::fabs(ref));
    const auto g = finite_diff(f, to_f64(v), 1e-6);
    const auto part = [&](size_t b, size_t e) {
        return rel_error(grad.data() + b, g.data() + b, e - b);
    };
    EXPECT_LT(part(o.x, o.wr), kGradTol) << "dx";
    EXPECT_LT(part(o.wr, o.w1), kGradTol) << "drouter";
    EXPECT_LT(part(o.w1, o.w2), kGradTol) << "dW1";
    EXPECT_LT(part(o.w2, o.total), kGradTol) << "dW2";
}

TEST(MoeLayer, Top1SoftmaxGradientsMatchFiniteDifferences) {
    check_layer({11, 6, 4, 1, 5, false, 1.0, true, 0.3f, 0.05f}, 21);
}

TEST(MoeLayer, Top2SoftmaxWithDroppedTokensGradientsMatch) {
    // capacity ceil(0.5 * 13 * 2 / 3) = 5 of 26 choices over 3 experts: drops.
    const LayerCase c{13, 6, 3, 2, 5, false, 0.5, false, 0.2f, 0.1f};
    check_layer(c, 22);
    EXPECT_EQ(k::moe_capacity(13, 3, 2, 0.5, false), 5);
}

TEST(MoeLayer, Top2SigmoidWithBiasGradientsMatch) {
    check_layer({9, 5, 5, 2, 4, true, 1.25, false, 0.5f, 0.02f}, 23, {0.1f, -0.2f, 0.0f, 0.3f, 0.0f});
}

TEST(MoeLayer, AuxGradientPushesLoadOffTheBusiestExpert) {
    // With only the aux loss, gradient descent on the router logits lowers
    // the score of the expert that got the most choices.
    const int N = 8, E = 3, K = 1;
    std::vector<float> logits(size_t(N * E), 0.0f);
    for (int t = 0; t < N; ++t) logits[size_t(t * E + (t < 6 ? 0 : 1 + t % 2))] = 1.0f;
    const Route r(logits, nullptr, N, E, K, false, N);
    std::vector<float> dgate(size_t(N * K), 0.0f), dl(size_t(N * E));
    k::moe_route_backward(dl.data(), dgate.data(), logits.data(), r.probs.data(), r.expert.data(),
                          r.routed.data(), N, E, K, k::MoeRouter::softmax, 1.0f, 0.0f);
    for (int t = 0; t < N; ++t) EXPECT_GT(dl[size_t(t * E)], 0.0f) << t;
}

}  // namespace
