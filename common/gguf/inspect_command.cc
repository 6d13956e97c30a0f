#include "common/gguf/inspect_command.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "common/gguf/gguf_file.h"
#include "common/gguf/inspect_format.h"

namespace tandem {

int RunInspectCommand(int argc, char** argv) {
  const char* path = nullptr;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fprintf(stdout, "usage: tandem inspect FILE.gguf [--json]\n");
      return 0;
    } else if (argv[i][0] == '-' || path != nullptr) {
      std::fprintf(stderr, "tandem inspect: unexpected argument '%s'\nusage: tandem inspect FILE.gguf [--json]\n",
                   argv[i]);
      return 2;
    } else {
      path = argv[i];
    }
  }
  if (path == nullptr) {
    std::fprintf(stderr, "usage: tandem inspect FILE.gguf [--json]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "tandem inspect: %s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  const std::string out = json ? FormatGgufJson(**file) : FormatGgufText(**file);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace tandem
