#include "host_expert_worker/bench/bench_command.h"
int main(int argc, char** argv) { return tandem::RunBenchCommand(argc - 1, argv + 1); }
