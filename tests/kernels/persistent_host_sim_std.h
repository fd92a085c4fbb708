// The standard headers of persistent_host_sim.cpp, apart so that the tests can precompile
// them once a session (testkit_kernels.build_host_sim): they are about half of a build's time
// and the same in every build, where the kernel source differs.
#ifndef PERSISTENT_HOST_SIM_STD_H
#define PERSISTENT_HOST_SIM_STD_H
#include <algorithm>
#include <atomic>
#include <barrier>
#include <optional>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#endif
