// On/off A/B switches and numeric settings for benchmarks, read from the environment (host code only).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace tandem::cuda {

// Whether the environment variable `name` is set to anything but "" or "0" (so VAR=1 turns a
// switch on and VAR=0 leaves it off). Callers read it once and keep the answer in a static: the
// switches choose a code path for the whole process.
inline bool EnvSwitch(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// A switch that is on unless the environment variable `name` is set to "" or "0" (VAR=0 turns it
// off): the A/B switches whose new path became the default.
inline bool EnvSwitchDefaultOn(const char* name) { return std::getenv(name) == nullptr || EnvSwitch(name); }

// The environment variable `name` as a base-10 integer in [min, max], or `fallback` where it is
// unset, empty, not wholly an integer, or out of that range; the last two also say so on stderr,
// naming the variable (a mistyped setting must not pass unnoticed in an A/B run). Read once by
// callers, as the switches.
inline long long EnvInteger(const char* name, long long fallback, long long min, long long max) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (end != v && *end == '\0' && errno == 0 && n >= min && n <= max) return n;
  std::fprintf(stderr, "%s=%s is not an integer in [%lld, %lld]: using %lld\n", name, v, min, max, fallback);
  return fallback;
}

// The environment variable `name` as one of `choices` (the text each value is set by): the value
// whose text equals it, or `fallback` where it is unset or empty. Any other text gives `fallback`
// and says so on stderr, naming the variable and the texts it takes. Read once by callers.
template <typename T>
T EnvChoice(const char* name, std::initializer_list<std::pair<std::string_view, T>> choices, T fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  for (const auto& [text, value] : choices) {
    if (text == v) return value;
  }
  std::string accepted;
  for (const auto& choice : choices) accepted += (accepted.empty() ? "" : ", ") + std::string(choice.first);
  std::fprintf(stderr, "%s=%s is not one of %s: using the default\n", name, v, accepted.c_str());
  return fallback;
}

// A process-wide on/off switch that tests and benchmarks can also set (the Set.../getter pairs of
// the A/B switches): `read` gives its value from the environment (EnvSwitch, EnvSwitchDefaultOn or
// their negation), called on the first on() that finds the switch unset; set() overrides it from
// then on. Define one at namespace scope: its constructor is constexpr, so it is initialized before
// any code runs. Relaxed atomics: a switch chooses a code path; it orders nothing.
class ProcessSwitch {
 public:
  using Reader = bool (*)();
  explicit constexpr ProcessSwitch(Reader read) : read_(read) {}
  ProcessSwitch(const ProcessSwitch&) = delete;
  ProcessSwitch& operator=(const ProcessSwitch&) = delete;

  bool on() const {
    int s = state_.load(std::memory_order_relaxed);
    if (s < 0) {
      // The first reader sets it from the environment, unless a set() came first.
      state_.compare_exchange_strong(s, read_() ? 1 : 0, std::memory_order_relaxed);
      s = state_.load(std::memory_order_relaxed);
    }
    return s != 0;
  }
  void set(bool on) { state_.store(on ? 1 : 0, std::memory_order_relaxed); }

 private:
  Reader read_;
  mutable std::atomic<int> state_{-1};  // -1: not yet read
};

// ProcessSwitch's counterpart for a numeric setting (a mode or a threshold): `read` gives its value
// from the environment (normally EnvInteger with the setting's default and range), called on the
// first value() that finds it unset; set() overrides it from then on. LLONG_MIN marks "not yet
// read", so it is not a value a setting can hold.
class ProcessInteger {
 public:
  using Reader = long long (*)();
  explicit constexpr ProcessInteger(Reader read) : read_(read) {}
  ProcessInteger(const ProcessInteger&) = delete;
  ProcessInteger& operator=(const ProcessInteger&) = delete;

  long long value() const {
    long long v = value_.load(std::memory_order_relaxed);
    if (v == kUnread) {
      // The first reader sets it from the environment, unless a set() came first.
      value_.compare_exchange_strong(v, read_(), std::memory_order_relaxed);
      v = value_.load(std::memory_order_relaxed);
    }
    return v;
  }
  void set(long long v) { value_.store(v, std::memory_order_relaxed); }

 private:
  static constexpr long long kUnread = LLONG_MIN;
  Reader read_;
  mutable std::atomic<long long> value_{kUnread};
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_
