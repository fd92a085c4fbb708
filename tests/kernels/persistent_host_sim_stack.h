// The stack kernels' mains of persistent_host_sim.cpp (included by it, after its
// primitives, helpers and launch(); see its header): PK_SIM_STACK, the forward stack kernel,
// PK_SIM_STACK_BWD, the stack backward, PK_SIM_STACK_MMA, the tensor-core stack kernel, and
// PK_SIM_STACK_MMA_BWD, its backward.
#if defined(PK_SIM_STACK) || defined(PK_SIM_STACK_BWD) || defined(PK_SIM_STACK_MMA) || \
    defined(PK_SIM_STACK_MMA_BWD)
// The arguments every main opens with: B H T L U SMEM_BYTES LAUNCHES DIR
struct StackSimArgs {
    int B, H, T, L, U;
    unsigned smem;
    int launches;
    std::string dir;
    explicit StackSimArgs(char** argv)
        : B(std::atoi(argv[1])), H(std::atoi(argv[2])), T(std::atoi(argv[3])),
          L(std::atoi(argv[4])), U(std::atoi(argv[5])), smem((unsigned)std::atol(argv[6])),
          launches(std::atoi(argv[7])), dir(argv[8]) {}
};

#ifdef PK_SIM_STACK
// The stack kernel (lstm_persistent_stack_fwd, or gru_persistent_stack_fwd with CELL gru),
// all layers in one launch:
//   persistent_host_sim_stack B H T L U SMEM_BYTES LAUNCHES DIR LDWIH LDWHH LDBW LDBR CELL
// reads DIR/{x,h,c,wih,whh,bw,br}.f32 (h and c: [L, T+1, B, H] with slot 0 of each layer
// set, the rest poisoned; GRU reads no c and writes c.out as read; wih / whh: L rows of LDW
// floats, the matrix at the start of each;
// bw / br: L rows of LDB floats, or one row when LDB is 0), launches LAUNCHES times with one
// sync buffer [groups, 2L] (groups = ceil(B / 64) batch groups side by side; re-poisoning the
// outputs and the kernel's transposes wt [L*H, 4H] and ht [groups*(L+1)*(T+1)*H, 64] in
// between, checking the counters are back to zero), writes DIR/{h,c,act,wt,ht}.out.
int main(int argc, char** argv) {
    if (argc != 14) {
        std::fprintf(stderr, "usage: see persistent_host_sim.cpp (PK_SIM_STACK)\n");
        return 2;
    }
    const std::string cell = argv[13];
    if (cell != "lstm" && cell != "gru") {
        std::fprintf(stderr, "unknown cell %s\n", cell.c_str());
        return 2;
    }
    const StackSimArgs a(argv);
    const int B = a.B, H = a.H, T = a.T, L = a.L, U = a.U, launches = a.launches;
    const unsigned smem = a.smem;
    const std::string& dir = a.dir;
    const int ldwih = std::atoi(argv[9]), ldwhh = std::atoi(argv[10]);
    const int ldbw = std::atoi(argv[11]), ldbr = std::atoi(argv[12]);
    auto load16 = [&](const char* name, std::vector<float4>& store) {
        return load_aligned(dir + "/" + name + ".f32", store);
    };
    std::vector<float4> xs, hs, cs, wis, whs, bws, brs;
    auto [x, nx] = load16("x", xs);
    auto [h, nh] = load16("h", hs);
    auto [c, nc] = load16("c", cs);
    auto [wih, nwi] = load16("wih", wis);
    auto [whh, nwh] = load16("whh", whs);
    auto [bw, nbw] = load16("bw", bws);
    auto [br, nbr] = load16("br", brs);
    (void)nx, (void)nwi, (void)nwh, (void)nbw, (void)nbr;
    std::vector<float> act((size_t)L * T * B * 4 * H);
    const int groups = (B + PS_BMAX - 1) / PS_BMAX;
    const size_t nwt = (size_t)L * H * 4 * H;
    const size_t nht = (size_t)groups * (L + 1) * (T + 1) * H * PS_BMAX;
    std::vector<float4> wts(nwt / 4), hts(nht / 4);
    float* const wt = reinterpret_cast<float*>(wts.data());
    float* const ht = reinterpret_cast<float*>(hts.data());
    std::vector<unsigned int> sync((size_t)groups * 2 * L, 0u);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int n = 0; n < launches; ++n) {
        for (int l = 0; l < L; ++l)   // poison every slot but slot 0 of each layer
            for (size_t e = (size_t)B * H; e < (size_t)(T + 1) * B * H; ++e) {
                h[(size_t)l * (T + 1) * B * H + e] = nan;
                c[(size_t)l * (T + 1) * B * H + e] = nan;
            }
        std::fill(act.begin(), act.end(), nan);
        std::fill(wt, wt + nwt, nan);
        std::fill(ht, ht + nht, nan);
        launch(groups * L * (H / U), 256, smem, [&] {
            if (cell == "gru")
                gru_persistent_stack_fwd(B, H, h, H, act.data(), 4 * H, sync.data(), 2 * L, wt,
                                         4 * H, ht, PS_BMAX, x, H, wih, ldwih, whh, ldwhh, bw,
                                         ldbw, br, ldbr, T, L, U, groups);
            else
                lstm_persistent_stack_fwd(B, H, h, H, c, H, act.data(), 4 * H, sync.data(),
                                          2 * L, wt, 4 * H, ht, PS_BMAX, x, H, wih, ldwih, whh,
                                          ldwhh, bw, ldbw, br, ldbr, T, L, U, groups);
        });
        if (!counters_zero(sync.data(), sync.size(), n)) return 3;
    }
    write_f32(dir + "/h.out", std::vector<float>(h, h + nh));
    write_f32(dir + "/c.out", std::vector<float>(c, c + nc));
    write_f32(dir + "/act.out", act);
    write_f32(dir + "/wt.out", std::vector<float>(wt, wt + nwt));
    write_f32(dir + "/ht.out", std::vector<float>(ht, ht + nht));
    return 0;
}
#elif defined(PK_SIM_STACK_MMA)
// The tensor-core stack kernel (lstm_persistent_stack_mma_fwd_t<TS, false>), all layers in
// one launch:
//   persistent_host_sim_stack_mma B H T L U SMEM_BYTES LAUNCHES DIR LDW LDB TS
// reads DIR/{x,h,c,wih,whh,bw,br}.f32 (x [T, B, H] and h [L, T+1, B, H] converted to TS (bf16
// or fp16: they must be representable; h's slot 0 of each layer set); c [L, T+1, B, H] with
// slot 0 set; wih / whh: L rows of LDW floats, the matrix at the start of each; bw / br: L
// rows of LDB floats, or one row when LDB is 0), launches LAUNCHES times with one sync
// buffer (every slot but slot 0 of h and c, and act, poisoned with NaN before each; the
// counters checked after each), writes DIR/{h,c,act}.out (h back as float). B > 64: B / 64
// whole batch groups (sync [groups, 2L]).
template <class TS>
static int run_stack_mma(const StackSimArgs& a, int ldw, int ldb) {
    const int B = a.B, H = a.H, T = a.T, L = a.L;
    auto load16 = [&](const char* name, std::vector<float4>& store) {
        return load_aligned(a.dir + "/" + name + ".f32", store).first;
    };
    // a TS array in 16-byte aligned storage (the kernel stages x and h with 16-byte copies)
    auto typed = [](const std::vector<float>& v, std::vector<float4>& store) {
        store.assign(v.size() / 8 + 1, float4{0, 0, 0, 0});
        TS* const p = reinterpret_cast<TS*>(store.data());
        for (size_t i = 0; i < v.size(); ++i) p[i] = from_f<TS>(v[i]);
        return p;
    };
    std::vector<float4> stores[6];
    const std::vector<float> x_in = read_f32(a.dir + "/x.f32"), h_in = read_f32(a.dir + "/h.f32");
    std::vector<float> c = read_f32(a.dir + "/c.f32");
    const TS* const x = typed(x_in, stores[0]);
    TS* const h = typed(h_in, stores[1]);
    const float* const wih = load16("wih", stores[2]);
    const float* const whh = load16("whh", stores[3]);
    const float* const bw = load16("bw", stores[4]);
    const float* const br = load16("br", stores[5]);
    std::vector<float> act((size_t)L * T * B * 4 * H);
    const int groups = B > PSM_BMAX ? B / PSM_BMAX : 1;   // whole batch groups past 64
    std::vector<unsigned int> sync((size_t)groups * 2 * L, 0u);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t slot = (size_t)B * H, layer = (T + 1) * slot;
    for (int n = 0; n < a.launches; ++n) {
        for (int l = 0; l < L; ++l)   // poison every slot but slot 0 of each layer
            for (size_t e = slot; e < layer; ++e) {
                h[l * layer + e] = from_f<TS>(nan);
                c[l * layer + e] = nan;
            }
        std::fill(act.begin(), act.end(), nan);
        launch(groups * L * (H / a.U), 256, a.smem, [&] {
            lstm_persistent_stack_mma_fwd_t<TS, false>(
                B, H, h, H, c.data(), H, act.data(), 4 * H, sync.data(), 2 * L, x, H, wih, ldw,
                whh, ldw, bw, ldb, br, ldb, T, L, a.U, groups);
        });
        if (!counters_zero(sync.data(), sync.size(), n)) return 3;
    }
    std::vector<float> h_out(h_in.size());
    for (size_t i = 0; i < h_out.size(); ++i) h_out[i] = to_f(h[i]);
    write_f32(a.dir + "/h.out", h_out);
    write_f32(a.dir + "/c.out", c);
    write_f32(a.dir + "/act.out", act);
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: see persistent_host_sim_stack.h (PK_SIM_STACK_MMA)\n");
        return 2;
    }
    const StackSimArgs a(argv);
    const int ldw = std::atoi(argv[9]), ldb = std::atoi(argv[10]);
    const std::string ts = argv[11];
    if (ts == "bf16") return run_stack_mma<bf16>(a, ldw, ldb);
    if (ts == "fp16") return run_stack_mma<fp16>(a, ldw, ldb);
    std::fprintf(stderr, "TS: bf16 or fp16, got %s\n", ts.c_str());
    return 2;
}
#elif defined(PK_SIM_STACK_MMA_BWD)
// The tensor-core stack backward (lstm_persistent_stack_mma_bwd_t<TS, false>, clusters of 2),
// all layers in one launch:
//   persistent_host_sim_stack_mma_bwd B H T L U SMEM_BYTES LAUNCHES DIR LDW TS
// reads DIR/{dhin,dhn,dcn,act,c,wih,whh}.f32 as the stack backward's main (PK_SIM_STACK_BWD),
// launches LAUNCHES times with one sync buffer (every output, dgx in TS and dhin but layer
// L-1's rows, poisoned with NaN before each; the counters checked after each), writes
// DIR/{dgx,dhin,dx,dh0,dc0}.out (dgx back as float).
template <class TS>
static int run_stack_mma_bwd(const StackSimArgs& a, int ldw) {
    const int B = a.B, H = a.H, T = a.T, L = a.L;
    std::vector<float4> stores[3];
    auto load16 = [&](const char* name, std::vector<float4>& store) {
        return load_aligned(a.dir + "/" + name + ".f32", store).first;
    };
    std::vector<float> dhin = read_f32(a.dir + "/dhin.f32"), dhn = read_f32(a.dir + "/dhn.f32");
    const std::vector<float> dcn = read_f32(a.dir + "/dcn.f32"), act = read_f32(a.dir + "/act.f32");
    const std::vector<float> c = read_f32(a.dir + "/c.f32");
    const float* const wih = load16("wih", stores[0]);
    const float* const whh = load16("whh", stores[1]);
    const size_t TBH = (size_t)T * B * H, ngx = (size_t)L * TBH * 4;
    stores[2].assign(ngx / 8 + 1, float4{0, 0, 0, 0});   // dgx: TS, 16-byte aligned rows
    TS* const dgx = reinterpret_cast<TS*>(stores[2].data());
    std::vector<float> dx(TBH), dh0((size_t)L * B * H), dc0(dh0.size());
    const int groups = B > PSM_BMAX ? B / PSM_BMAX : 1;   // whole batch groups past 64
    std::vector<unsigned int> sync((size_t)groups * 2 * L, 0u);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    sim_cluster = 2;
    for (int n = 0; n < a.launches; ++n) {
        for (auto* v : {&dx, &dh0, &dc0}) std::fill(v->begin(), v->end(), nan);
        std::fill(dhin.begin(), dhin.begin() + (L - 1) * TBH, nan);   // not layer L-1's (dy)
        for (size_t e = 0; e < ngx; ++e) dgx[e] = from_f<TS>(nan);
        launch(groups * L * (H / a.U), 256, a.smem, [&] {
            lstm_persistent_stack_mma_bwd_t<TS, false>(
                B, H, dgx, 4 * H, dhin.data(), H, dx.data(), H, dh0.data(), H, dc0.data(), H,
                sync.data(), 2 * L, dhn.data(), H, dcn.data(), H, act.data(), 4 * H, c.data(),
                H, wih, ldw, whh, ldw, T, L, a.U, groups);
        });
        if (!counters_zero(sync.data(), sync.size(), n)) return 3;
    }
    std::vector<float> dgx_out(ngx);
    for (size_t e = 0; e < ngx; ++e) dgx_out[e] = to_f(dgx[e]);
    write_f32(a.dir + "/dgx.out", dgx_out);
    write_f32(a.dir + "/dhin.out", dhin);
    write_f32(a.dir + "/dx.out", dx);
    write_f32(a.dir + "/dh0.out", dh0);
    write_f32(a.dir + "/dc0.out", dc0);
    return 0;
}

int main(int argc, char** argv) {
    if (argc != 11) {
        std::fprintf(stderr, "usage: see persistent_host_sim_stack.h (PK_SIM_STACK_MMA_BWD)\n");
        return 2;
    }
    const StackSimArgs a(argv);
    const int ldw = std::atoi(argv[9]);
    const std::string ts = argv[10];
    if (ts == "bf16") return run_stack_mma_bwd<bf16>(a, ldw);
    if (ts == "fp16") return run_stack_mma_bwd<fp16>(a, ldw);
    std::fprintf(stderr, "TS: bf16 or fp16, got %s\n", ts.c_str());
    return 2;
}
#elif defined(PK_SIM_STACK_BWD)
// The stack backward (lstm_persistent_stack_bwd, or with persistent_stack_bwd_pair.cu as the
// source, which defines SP_PU, lstm_persistent_stack_bwd_pair in clusters of 2), all layers
// in one launch:
//   persistent_host_sim_stack_bwd B H T L U SMEM_BYTES LAUNCHES DIR LDW [gru]
// reads DIR/{dhin,dhn,dcn,act,c,wih,whh}.f32 (dhin [L, T, B, H]: layer L-1's rows dy, the
// others poisoned; wih / whh: L rows of LDW floats, the matrix at the start of each), launches
// LAUNCHES times with one sync buffer (re-poisoning every output and the dgt scratch in
// between, checking the counters are back to zero), writes DIR/{dgx,dhin,dx,dh0,dc0}.out.
// B > 64 runs as B / 64 batch groups (sync [groups, 2L], dgt a block of 8*L*H rows each).
// gru: gru_persistent_stack_bwd (or _pair), c.f32 holding the forward's h,
// dcn unread, dgx and dgh [L, T, B, 3H] (dgh.out too; dc0.out stays poisoned).
int main(int argc, char** argv) {
    if (argc != 10 && !(argc == 11 && std::string(argv[10]) == "gru")) {
        std::fprintf(stderr, "usage: see persistent_host_sim.cpp (PK_SIM_STACK_BWD)\n");
        return 2;
    }
    const bool gru = argc == 11;
    const StackSimArgs a(argv);
    const int B = a.B, H = a.H, T = a.T, L = a.L, U = a.U, launches = a.launches;
    const unsigned smem = a.smem;
    const std::string& dir = a.dir;
    const int ldw = std::atoi(argv[9]);
    std::vector<float4> stores[3];
    auto load16 = [&](const char* name, std::vector<float4>& store) {
        return load_aligned(dir + "/" + name + ".f32", store).first;
    };
    std::vector<float> dhin = read_f32(dir + "/dhin.f32"), dhn = read_f32(dir + "/dhn.f32");
    const std::vector<float> dcn = read_f32(dir + "/dcn.f32"), act = read_f32(dir + "/act.f32");
    const std::vector<float> c = read_f32(dir + "/c.f32");
    const float* const wih = load16("wih", stores[0]);
    const float* const whh = load16("whh", stores[1]);
    const int groups = B > SB_BMAX ? B / SB_BMAX : 1;
    const size_t TBH = (size_t)T * B * H, ngt = (size_t)groups * 8 * L * H * SB_BMAX;
    float* const dgt = at_offset(stores[2], ngt, 0);
    std::vector<float> dgx(L * TBH * (gru ? 3 : 4)), dx(TBH), dh0((size_t)L * B * H),
        dc0(dh0.size()), dgh(gru ? L * TBH * 3 : 0);
    std::vector<unsigned int> sync((size_t)groups * 2 * L, 0u);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int n = 0; n < launches; ++n) {
        for (auto* v : {&dgx, &dx, &dh0, &dc0, &dgh}) std::fill(v->begin(), v->end(), nan);
        std::fill(dhin.begin(), dhin.begin() + (L - 1) * TBH, nan);   // not layer L-1's (dy)
        std::fill(dgt, dgt + ngt, nan);
#ifdef SP_PU
        sim_cluster = 2;
#define SB_SIM_KERNEL lstm_persistent_stack_bwd_pair
#else
#define SB_SIM_KERNEL lstm_persistent_stack_bwd
#endif
#ifdef SP_PU
#define SB_SIM_GRU_KERNEL gru_persistent_stack_bwd_pair
#else
#define SB_SIM_GRU_KERNEL gru_persistent_stack_bwd
#endif
        launch(groups * L * (H / U), 256, smem, [&] {
            if (gru) {
                SB_SIM_GRU_KERNEL(B, H, dgx.data(), 3 * H, dgh.data(), 3 * H, dhin.data(), H,
                                  dx.data(), H, dh0.data(), H, sync.data(), 2 * L, dgt, SB_BMAX,
                                  dhn.data(), H, act.data(), 4 * H, c.data(), H, wih, ldw, whh,
                                  ldw, T, L, U, groups);
                return;
            }
            SB_SIM_KERNEL(B, H, dgx.data(), 4 * H, dhin.data(), H, dx.data(), H, dh0.data(), H,
                          dc0.data(), H, sync.data(), 2 * L, dgt, SB_BMAX, dhn.data(), H,
                          dcn.data(), H, act.data(), 4 * H, c.data(), H, wih, ldw, whh, ldw, T,
                          L, U, groups);
        });
        if (!counters_zero(sync.data(), sync.size(), n)) return 3;
    }
    write_f32(dir + "/dgx.out", dgx);
    write_f32(dir + "/dhin.out", dhin);
    write_f32(dir + "/dx.out", dx);
    write_f32(dir + "/dh0.out", dh0);
    write_f32(dir + "/dc0.out", dc0);
    if (gru) write_f32(dir + "/dgh.out", dgh);
    return 0;
}
#endif
#endif
