// SPDX-License-Identifier: Apache-2.0
// Fuzzing of spec and manifest parsing with a fixed seed and a fixed number of inputs: random
// bytes, mutations of valid canonical specs, control characters, huge numbers, long lines. Each
// input must parse into a spec that prints and parses back to itself, or throw kiln::Error with
// a message free of control characters; never crash, hang or throw anything else.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

constexpr std::uint64_t kSeed = 0x6b696c6e13;
constexpr int kInputs = 20000;
constexpr int kManifests = 400;

class Fuzzer {
 public:
  Fuzzer() : rng_(kSeed) {
    for (const char* target : {"sm_90a", "gfx90a"}) {
      for (const KernelSpec& spec : default_specs(target)) corpus_.push_back(to_string(spec));
    }
    KernelSpec with_options = parse_spec(corpus_.front());
    with_options.options = {"-DKILN_TRACE=1", "--use_fast_math"};
    with_options.target.clear();
    corpus_.push_back(to_string(with_options));
  }

  std::string input() {
    switch (below(4)) {
      case 0: return random_bytes(below(200));
      case 1: return long_line();
      default: return mutated(pick(corpus_));
    }
  }

  std::size_t below(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
  }

 private:
  template <class T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }

  std::string random_bytes(std::size_t n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(below(256));
    return bytes;
  }

  // A canonical spec stretched past any buffer a parser might assume.
  std::string long_line() {
    std::string spec = pick(corpus_);
    const std::string filler(1000 + below(20000), "a9_,=<>:"[below(8)]);
    spec.insert(below(spec.size() + 1), filler);
    return spec;
  }

  std::string mutated(std::string text) {
    static const std::vector<std::string> kPieces = {":",
                                                     "<",
                                                     ">",
                                                     "(",
                                                     ")",
                                                     "=",
                                                     ",",
                                                     "[",
                                                     "]",
                                                     " ",
                                                     " @",
                                                     " [",
                                                     ">(",
                                                     "::",
                                                     "#",
                                                     "\x1b[2J",
                                                     "\n",
                                                     "\r",
                                                     "\t",
                                                     std::string(1, '\0'),
                                                     "\x7f",
                                                     "\xff",
                                                     "true",
                                                     "false",
                                                     "bf16",
                                                     "99999999999999999999",
                                                     "-9223372036854775808",
                                                     "9223372036854775807",
                                                     "-DX=1",
                                                     "--include-path=/etc",
                                                     "@gfx942",
                                                     "../",
                                                     "/etc/passwd"};
    const std::size_t edits = 1 + below(4);
    for (std::size_t i = 0; i < edits; ++i) {
      const std::size_t at = below(text.size() + 1);
      switch (below(5)) {
        case 0: text.insert(at, pick(kPieces)); break;
        case 1: text.erase(at, below(8)); break;
        case 2:
          if (at < text.size()) text[at] = static_cast<char>(below(256));
          break;
        case 3: text.insert(at, text.substr(below(text.size() + 1), below(16))); break;
        case 4: text.resize(at); break;
      }
    }
    return text;
  }

  std::mt19937_64 rng_;
  std::vector<std::string> corpus_;
};

bool has_control_character(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
  });
}

// `spec` with its constants in the order to_string prints them.
KernelSpec sorted(KernelSpec spec) {
  std::sort(spec.constants.begin(), spec.constants.end(),
            [](const Constant& a, const Constant& b) { return a.name < b.name; });
  return spec;
}

void check_round_trip(const KernelSpec& spec, const std::string& input) {
  const std::string text = to_string(spec);
  KernelSpec again;
  try {
    again = parse_spec(text);
  } catch (const Error& e) {
    FAIL("parsed, but its canonical form does not: " << e.what() << "\ninput: " << input
                                                     << "\ncanonical: " << text);
  }
  if (again != sorted(spec)) {
    FAIL("parsed, but does not parse back from its canonical form\ninput: "
         << input << "\ncanonical: " << text << "\nagain: " << to_string(again));
  }
}

void check_error(const Error& e, const std::string& input) {
  if (has_control_character(e.what())) {
    FAIL("the message echoes a control character: " << e.what() << "\ninput: " << input);
  }
}

TEST_CASE("any spec text parses into a spec that round-trips, or is refused", "[fuzz]") {
  std::printf("spec fuzz: seed %#llx, %d specs\n", static_cast<unsigned long long>(kSeed), kInputs);
  Fuzzer fuzz;
  for (int i = 0; i < kInputs; ++i) {
    const std::string input = fuzz.input();
    try {
      check_round_trip(parse_spec(input), input);
    } catch (const Error& e) {
      check_error(e, input);
    }
  }
}

TEST_CASE("any manifest reads as specs that round-trip, or is refused naming its line", "[fuzz]") {
  std::printf("manifest fuzz: seed %#llx, %d manifests\n", static_cast<unsigned long long>(kSeed),
              kManifests);
  Fuzzer fuzz;
  const TempDir dir;
  for (int i = 0; i < kManifests; ++i) {
    std::string manifest;
    const std::size_t lines = fuzz.below(12);
    for (std::size_t line = 0; line < lines; ++line) {
      manifest += fuzz.below(4) == 0 ? "# a comment" : fuzz.input();
      manifest += fuzz.below(3) == 0 ? "\r\n" : "\n";
    }
    // Every tenth goes through the file reader too, which must agree.
    const bool from_file = i % 10 == 0;
    if (from_file) write_file(dir.path() / "manifest.txt", manifest);
    try {
      const std::vector<KernelSpec> specs = from_file
                                                ? detail::read_manifest(dir.path() / "manifest.txt")
                                                : detail::parse_manifest(manifest, "fuzz.txt");
      for (const KernelSpec& spec : specs) check_round_trip(spec, manifest);
    } catch (const Error& e) {
      check_error(e, manifest);
      CHECK_THAT(e.what(), Catch::Contains(from_file ? "manifest.txt:" : "fuzz.txt:"));
    }
  }
}

}  // namespace
}  // namespace kiln::test
