// The tensor-core kernels' mains of persistent_host_sim.cpp (included by it, after its
// primitives, helpers and launch(); see its header): PK_SIM_MMA, the tensor-core grid
// kernels (persistent_mma.cu), and with PK_SIM_MMAC / PK_SIM_MMAC16 the tensor-core cluster
// kernels in their stead (persistent_mmac.cu, clusters of 8 / 16; PK_SIM_MMACW their wide
// form, persistent_mmacw.cu; PK_SIM_MMACG their grid form, persistent_mmag.cu);
// PK_SIM_MMA_BWD, the
// tensor-core backward grid kernels (persistent_mma_bwd.cu).
#if defined(PK_SIM_MMA) || defined(PK_SIM_MMA_BWD)
#if defined(PK_SIM_MMACG)   // the forward main below runs the tensor-core cluster kernels'
#define lstm_persistent_mma_fwd_t lstm_persistent_mmacg_fwd_t   // grid form (the grid barrier)
#define gru_persistent_mma_fwd_t gru_persistent_mmacg_fwd_t
#define rnn_tanh_persistent_mma_fwd_t rnn_tanh_persistent_mmacg_fwd_t
#define rnn_relu_persistent_mma_fwd_t rnn_relu_persistent_mmacg_fwd_t
#define PK_SIM_CLUSTER 2   // PK_MMAG_CLUSTER: the grid form's pairs
#elif defined(PK_SIM_MMACW)   // ... their wide form (clusters of 8, several n8 tiles)
#define lstm_persistent_mma_fwd_t lstm_persistent_mmacw_fwd_t
#define gru_persistent_mma_fwd_t gru_persistent_mmacw_fwd_t
#define rnn_tanh_persistent_mma_fwd_t rnn_tanh_persistent_mmacw_fwd_t
#define rnn_relu_persistent_mma_fwd_t rnn_relu_persistent_mmacw_fwd_t
#define PK_SIM_CLUSTER 8
#elif defined(PK_SIM_MMAC16)   // the forward main below runs the tensor-core cluster kernels
#define lstm_persistent_mma_fwd_t lstm_persistent_mmac16_fwd_t
#define gru_persistent_mma_fwd_t gru_persistent_mmac16_fwd_t
#define rnn_tanh_persistent_mma_fwd_t rnn_tanh_persistent_mmac16_fwd_t
#define rnn_relu_persistent_mma_fwd_t rnn_relu_persistent_mmac16_fwd_t
#define PK_SIM_CLUSTER 16
#elif defined(PK_SIM_MMAC)
#define lstm_persistent_mma_fwd_t lstm_persistent_mmac_fwd_t
#define gru_persistent_mma_fwd_t gru_persistent_mmac_fwd_t
#define rnn_tanh_persistent_mma_fwd_t rnn_tanh_persistent_mmac_fwd_t
#define rnn_relu_persistent_mma_fwd_t rnn_relu_persistent_mmac_fwd_t
#define PK_SIM_CLUSTER 8
#endif
#ifdef PK_SIM_MMA
// The tensor-core grid kernels (persistent_mma.cu, `*_persistent_mma_fwd_t<TS, false>`):
//   persistent_host_sim_mma CELL B H T U BLOCKS THREADS SMEM_BYTES LAUNCHES DIR K_TILE TS
// (TS: bf16 or fp16) reads DIR/{h,c,act,gx,w,bw,br}.f32 (dense: ld = H, 4H, G*H; biases one
// row, ld 0), h converted to TS (its slot 0 must be representable), launches LAUNCHES times
// (outputs poisoned with NaN before each, the counters checked after each), writes
// DIR/{h,c,act}.out (h back as float).
template <class TS>
static int run_mma(const std::string& cell, int B, int H, int T, int U, int blocks,
                   int threads, unsigned smem, int launches, const std::string& dir, int kt) {
    const int G = cell == "lstm" ? 4 : cell == "gru" ? 3 : 1;
    const std::vector<float> h_in = read_f32(dir + "/h.f32");
    std::vector<float> c = read_f32(dir + "/c.f32"), act = read_f32(dir + "/act.f32");
    std::vector<float> gx = read_f32(dir + "/gx.f32"), w = read_f32(dir + "/w.f32");
    std::vector<float> bw = read_f32(dir + "/bw.f32"), br = read_f32(dir + "/br.f32");
    std::vector<TS> h(h_in.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = from_f<TS>(h_in[i]);
    unsigned int sync[2] = {0, 0};
#ifdef PK_SIM_CLUSTER
    sim_cluster = PK_SIM_CLUSTER;   // the tensor-core cluster kernels' blocks a cluster
#endif
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int l = 0; l < launches; ++l) {
        std::fill(h.begin() + (size_t)B * H, h.end(), from_f<TS>(nan));
        if (!c.empty()) std::fill(c.begin() + (size_t)B * H, c.end(), nan);
        std::fill(act.begin(), act.end(), nan);
        std::function<void()> k;
        if (cell == "lstm")
            k = [&] { lstm_persistent_mma_fwd_t<TS, false>(B, H, h.data(), H, c.data(), H,
                      act.data(), 4 * H, sync, 2, gx.data(), G * H, w.data(), H, bw.data(), 0,
                      br.data(), 0, T, U, kt); };
        else if (cell == "gru")
            k = [&] { gru_persistent_mma_fwd_t<TS, false>(B, H, h.data(), H, act.data(), 4 * H,
                      sync, 2, gx.data(), G * H, w.data(), H, bw.data(), 0, br.data(), 0, T, U,
                      kt); };
        else if (cell == "rnn_tanh")
            k = [&] { rnn_tanh_persistent_mma_fwd_t<TS, false>(B, H, h.data(), H, sync, 2,
                      gx.data(), H, w.data(), H, bw.data(), 0, br.data(), 0, T, U, kt); };
        else
            k = [&] { rnn_relu_persistent_mma_fwd_t<TS, false>(B, H, h.data(), H, sync, 2,
                      gx.data(), H, w.data(), H, bw.data(), 0, br.data(), 0, T, U, kt); };
        launch(blocks, threads, smem, k);
        if (!counters_zero(sync, 2, l)) return 3;
    }
    std::vector<float> h_out(h.size());
    for (size_t i = 0; i < h.size(); ++i) h_out[i] = to_f(h[i]);
    write_f32(dir + "/h.out", h_out);
    write_f32(dir + "/c.out", c);
    write_f32(dir + "/act.out", act);
    return 0;
}

#else   // PK_SIM_MMA_BWD
// The tensor-core backward grid kernels (persistent_mma_bwd.cu, `*_persistent_mma_bwd_t<TS,
// false>`), one layer, dense arrays (ld = G*H for dgx / dgh, H, 4H for act, H for w):
//   persistent_host_sim_mma_bwd CELL B H T U BLOCKS THREADS SMEM_BYTES LAUNCHES DIR K_TILE TS
// reads DIR/{dhin,dhn,dcn,act,st,w}.f32 (st: c for the LSTM, fp32; h for the others,
// converted to TS: it must be representable), launches LAUNCHES times (dgx, dgh, dh0, dc0
// poisoned with NaN before each, the counters checked after each), writes
// DIR/{dgx,dgh,dh0,dc0}.out (dgx, dgh back as float; the arrays a cell has not: empty).
template <class TS>
static int run_mma(const std::string& cell, int B, int H, int T, int U, int blocks,
                       int threads, unsigned smem, int launches, const std::string& dir,
                       int kt) {
    const int G = cell == "lstm" ? 4 : cell == "gru" ? 3 : 1;
    auto load = [&](const char* name) { return read_f32(dir + "/" + name + ".f32"); };
    const std::vector<float> dhin = load("dhin"), dhn = load("dhn"), dcn = load("dcn");
    const std::vector<float> act = load("act"), st = load("st"), w = load("w");
    std::vector<TS> hts(cell == "lstm" ? 0 : st.size());
    for (size_t i = 0; i < hts.size(); ++i) hts[i] = from_f<TS>(st[i]);
    const size_t ng = (size_t)T * B * G * H;
    std::vector<TS> dgx(ng), dgh(cell == "gru" ? ng : 0);
    std::vector<float> dh0((size_t)B * H), dc0(cell == "lstm" ? (size_t)B * H : 0);
    unsigned int sync[2] = {0, 0};
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int l = 0; l < launches; ++l) {   // every output poisoned: this launch writes it
        std::fill(dgx.begin(), dgx.end(), from_f<TS>(nan));
        std::fill(dgh.begin(), dgh.end(), from_f<TS>(nan));
        std::fill(dh0.begin(), dh0.end(), nan);
        std::fill(dc0.begin(), dc0.end(), nan);
        std::function<void()> k;
        if (cell == "lstm")
            k = [&] { lstm_persistent_mma_bwd_t<TS, false>(B, H, dgx.data(), G * H, dh0.data(),
                      H, dc0.data(), H, sync, 2, dhin.data(), H, dhn.data(), H, dcn.data(), H,
                      act.data(), 4 * H, st.data(), H, w.data(), H, T, U, kt); };
        else if (cell == "gru")
            k = [&] { gru_persistent_mma_bwd_t<TS, false>(B, H, dgx.data(), G * H, dgh.data(),
                      G * H, dh0.data(), H, sync, 2, dhin.data(), H, dhn.data(), H, act.data(),
                      4 * H, hts.data(), H, w.data(), H, T, U, kt); };
        else
            k = [&] { (cell == "rnn_tanh" ? rnn_tanh_persistent_mma_bwd_t<TS, false>
                                          : rnn_relu_persistent_mma_bwd_t<TS, false>)(
                      B, H, dgx.data(), H, dh0.data(), H, sync, 2, dhin.data(), H, dhn.data(),
                      H, hts.data(), H, w.data(), H, T, U, kt); };
        launch(blocks, threads, smem, k);
        if (!counters_zero(sync, 2, l)) return 3;
    }
    auto as_float = [](const std::vector<TS>& v) {
        std::vector<float> out(v.size());
        for (size_t i = 0; i < v.size(); ++i) out[i] = to_f(v[i]);
        return out;
    };
    write_f32(dir + "/dgx.out", as_float(dgx));
    write_f32(dir + "/dgh.out", as_float(dgh));
    write_f32(dir + "/dh0.out", dh0);
    write_f32(dir + "/dc0.out", dc0);
    return 0;
}

#endif
// either main's (the kernels' run above, at TS bf16 or fp16)
int main(int argc, char** argv) {
    if (argc != 13) {
        std::fprintf(stderr, "usage: see persistent_host_sim.cpp (PK_SIM_MMA, PK_SIM_MMA_BWD)\n");
        return 2;
    }
    const std::string cell = argv[1], dir = argv[10], ts = argv[12];
    const int B = std::atoi(argv[2]), H = std::atoi(argv[3]), T = std::atoi(argv[4]);
    const int U = std::atoi(argv[5]), blocks = std::atoi(argv[6]), threads = std::atoi(argv[7]);
    const unsigned smem = (unsigned)std::atol(argv[8]);
    const int launches = std::atoi(argv[9]), kt = std::atoi(argv[11]);
    if (ts == "bf16") return run_mma<bf16>(cell, B, H, T, U, blocks, threads, smem, launches, dir, kt);
    if (ts == "fp16") return run_mma<fp16>(cell, B, H, T, U, blocks, threads, smem, launches, dir, kt);
    std::fprintf(stderr, "TS: bf16 or fp16, got %s\n", ts.c_str());
    return 2;
}
#endif
