// Command-line pieces shared by the backend's benchmark tools (gpu_backend_bench,
// gpu_backend_timeline): no flags library on purpose, the tools take a handful of flags.
#ifndef TANDEM_TESTS_GPU_BACKEND_BENCH_ARGS_H_
#define TANDEM_TESTS_GPU_BACKEND_BENCH_ARGS_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem {

// argv[++i], the value of `flag` at argv[i]; exits with status 2 naming the flag when there is none.
inline std::string NextArgValue(int argc, char** argv, int& i, const std::string& flag) {
  if (i + 1 >= argc) {
    fprintf(stderr, "%s needs a value\n", flag.c_str());
    exit(2);
  }
  return argv[++i];
}

// out = (v == yes) for a flag that takes one of two words; false (and a message naming the flag)
// for any other word.
inline bool ParseChoice(const std::string& flag, const std::string& v, const char* yes, const char* no, bool& out) {
  if (v != yes && v != no) {
    fprintf(stderr, "%s: '%s' is not %s or %s\n", flag.c_str(), v.c_str(), yes, no);
    return false;
  }
  out = v == yes;
  return true;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_GPU_BACKEND_BENCH_ARGS_H_
