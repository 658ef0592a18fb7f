// SPDX-License-Identifier: Apache-2.0
// Turns every fenced code block of a Markdown file into something tests/readme/run.cmake checks:
//
//   ```cpp / ```c   a program: OUT/readme_L<line>.cpp (.c) and its target in OUT/CMakeLists.txt,
//                   built against an installed kiln and run. A block is a whole program, unless
//                   the line before its fence is `<!-- readme-wrapper: NAME -->`: then it is
//                   pasted into tests/readme/NAME.cpp (.c) in place of the line
//                   `// README snippet`, its #include lines hoisted to the top of the file.
//   ```sh           each command line becomes a check_command() call in OUT/checks.cmake.
//   ```python       OUT/readme_L<line>.py, which must compile (python3 -m py_compile): it needs
//                   torch and a GPU to run, which python/tests/test_readme.py does.
//
// Any other fence is an error, so that no block goes unchecked. Usage:
//   kiln_readme_blocks README.md WRAPPER_DIR OUT_DIR
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::string kFence = "```";
const std::string kWrapperNote = "<!-- readme-wrapper: ";
const std::string kMarker = "// README snippet";

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// A CMake bracket argument holds any text but its own closing bracket.
std::string cmake_quote(const std::string& text) {
  return "[==[" + text + "]==]";
}

struct Block {
  std::size_t line = 0;  // of the first line inside the fence, 1-based
  std::string language;
  std::string wrapper;  // empty: a whole program
  std::vector<std::string> lines;
};

std::vector<Block> parse(const fs::path& readme) {
  std::istringstream text(read_file(readme));
  std::vector<Block> blocks;
  std::string line, previous;
  std::size_t number = 0;
  Block* open = nullptr;
  while (std::getline(text, line)) {
    ++number;
    if (open != nullptr) {
      if (line.starts_with(kFence)) {
        open = nullptr;
      } else {
        open->lines.push_back(line);
      }
    } else if (line.starts_with(kFence)) {
      Block& block = blocks.emplace_back();
      block.line = number + 1;
      block.language = line.substr(kFence.size());
      if (previous.starts_with(kWrapperNote) && previous.ends_with(" -->")) {
        block.wrapper = previous.substr(kWrapperNote.size(), previous.size() - kWrapperNote.size() -
                                                                 std::string(" -->").size());
      }
      open = &block;
    }
    previous = line;
  }
  if (open != nullptr) {
    throw std::runtime_error(readme.string() + ":" + std::to_string(open->line - 1) +
                             ": the code block is never closed");
  }
  return blocks;
}

std::string program_source(const Block& block, const fs::path& readme, const fs::path& wrappers,
                           const std::string& extension) {
  const std::string line_directive =
      "#line " + std::to_string(block.line) + " \"" + readme.string() + "\"\n";
  std::string body;
  std::string includes;
  for (const std::string& line : block.lines) {
    const bool hoist = !block.wrapper.empty() && line.starts_with("#include");
    (hoist ? includes : body) += line + "\n";
    if (hoist) body += "\n";  // keeps the README's line numbers
  }
  if (block.wrapper.empty()) return line_directive + body;
  const fs::path wrapper_path = wrappers / (block.wrapper + extension);
  const std::string wrapper = read_file(wrapper_path);
  // The marker's line, whatever its indent.
  const std::size_t found = wrapper.find(kMarker + "\n");
  if (found == std::string::npos) {
    throw std::runtime_error(wrapper_path.string() + " has no line `" + kMarker + "`");
  }
  const std::size_t start = wrapper.rfind('\n', found) + 1;  // npos + 1 == 0: the first line
  const std::size_t end = found + kMarker.size() + 1;
  const auto next_line = std::count(wrapper.begin(), wrapper.begin() + start, '\n') + 2;
  // Compiler messages name README lines for the block's code and wrapper lines for the rest.
  return includes + "#line 1 \"" + wrapper_path.string() + "\"\n" + wrapper.substr(0, start) +
         line_directive + body + "#line " + std::to_string(next_line) + " \"" +
         wrapper_path.string() + "\"\n" + wrapper.substr(end);
}

// Words of one shell line, without its comment.
std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line.substr(0, line.find('#')));
  std::vector<std::string> result;
  for (std::string word; in >> word;) result.push_back(word);
  return result;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) {
    std::cerr << "usage: kiln_readme_blocks README.md WRAPPER_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path readme = fs::absolute(argv[1]);
  const fs::path wrappers = fs::absolute(argv[2]);
  const fs::path out = argv[3];
  fs::create_directories(out);
  std::string project =
      "cmake_minimum_required(VERSION 3.22)\nproject(kiln_readme LANGUAGES C CXX)\n"
      "find_package(kiln REQUIRED)\n";
  std::string checks;
  for (const Block& block : parse(readme)) {
    const std::string where = readme.string() + ":" + std::to_string(block.line - 1);
    if (block.language == "cpp" || block.language == "c") {
      const std::string extension = block.language == "cpp" ? ".cpp" : ".c";
      const std::string name = "readme_L" + std::to_string(block.line);
      write_file(out / (name + extension), program_source(block, readme, wrappers, extension));
      project += "add_executable(" + name + " " + name + extension + ")\ntarget_link_libraries(" +
                 name + " PRIVATE kiln::kiln)\n";
      checks += "check_program(" + name + ")\n";
    } else if (block.language == "sh") {
      for (std::size_t i = 0; i < block.lines.size(); ++i) {
        const std::vector<std::string> command = words(block.lines[i]);
        if (command.empty()) continue;
        // NOTE: built piece by piece: GCC 12 at -O3 misreads a chain of std::string sums as an
        // overlapping copy (-Wrestrict).
        std::string location = readme.string();
        location += ':';
        location += std::to_string(block.line + i);
        checks += "check_command(";
        checks += cmake_quote(location);
        for (const std::string& word : command) {
          checks += ' ';
          checks += cmake_quote(word);
        }
        checks += ")\n";
      }
    } else if (block.language == "python") {
      // Blank lines first, so that a syntax error names the block's README line.
      std::string source(block.line - 1, '\n');
      for (const std::string& line : block.lines) source += line + "\n";
      const fs::path file = fs::absolute(out / ("readme_L" + std::to_string(block.line) + ".py"));
      write_file(file, source);
      checks += "check_python(" + cmake_quote(where) + " " + cmake_quote(file.string()) + ")\n";
    } else {
      throw std::runtime_error(where + ": a code block in '" + block.language +
                               "', which nothing checks: use cpp, c, sh or python, or teach "
                               "tests/readme/blocks.cpp to check it");
    }
  }
  write_file(out / "CMakeLists.txt", project);
  write_file(out / "checks.cmake", checks);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "kiln_readme_blocks: " << e.what() << "\n";
  return 1;
}
