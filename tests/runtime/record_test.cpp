// KILN_RECORD and Options::record: the specs Runtime::kernel is asked for, appended to a manifest
// by many threads and processes at once; an unwritable file is one warning, never a failure.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cache/entries.hpp"
#include "jit/manifest.hpp"
#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "runtime/processes.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;

const std::vector<kiln::KernelSpec>& specs() {
  static const std::vector<kiln::KernelSpec> specs = [] {
    std::vector<kiln::KernelSpec> list;
    for (int op = 0; op < 4; ++op) {
      list.push_back(kiln::unary_spec(static_cast<kiln::UnaryOp>(op), kiln::DType::f32, {256, 4}));
    }
    return list;
  }();
  return specs;
}

// Asks `rt` for every spec from 8 threads, each twice. Here no call loads: with no GPU there is
// no device, and a GPU (sm_90a) is not the runtime's sm_80; the specs are recorded all the same.
void ask_for_all(kiln::Runtime& rt) {
  std::vector<std::jthread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&rt] {
      for (int round = 0; round < 2; ++round) {
        for (const kiln::KernelSpec& spec : specs()) {
          try {
            rt.kernel(spec);
          } catch (const kiln::Error&) {
          }
        }
      }
    });
  }
}

// The canonical spec of each line of the manifest at `path`, with the times it occurs.
std::map<std::string, int> recorded(const fs::path& path) {
  std::map<std::string, int> counts;
  for (const kiln::KernelSpec& spec : kiln::detail::read_manifest(path)) {
    ++counts[kiln::to_string(spec)];
  }
  return counts;
}

}  // namespace

TEST_CASE("KILN_RECORD appends each spec once per runtime, from threads and processes at once",
          "[runtime]") {
  kiln::test::TempDir dir;
  const fs::path manifest = dir.path() / "specs.manifest";
  // Two processes, one recording through KILN_RECORD and one through Options::record.
  kiln::test::in_processes(2, [&](int index) {
    kiln::Options options = kiln::test::isolated_options(dir.path() / "cache", "sm_80");
    if (index == 0) {
      ::setenv("KILN_RECORD", manifest.c_str(), 1);
    } else {
      options.record = manifest;
    }
    kiln::Runtime rt(options);
    ask_for_all(rt);
    return true;
  });
  // And a second runtime in this process, which records its own.
  kiln::Options options = kiln::test::isolated_options(dir.path() / "cache", "sm_80");
  options.record = manifest;
  {
    kiln::Runtime rt(options);
    ask_for_all(rt);
  }

  const std::map<std::string, int> counts = recorded(manifest);
  REQUIRE(counts.size() == specs().size());
  for (kiln::KernelSpec spec : specs()) {
    spec.target = "sm_80";  // recorded with the target the runtime gave it
    INFO(kiln::to_string(spec));
    CHECK(counts.contains(kiln::to_string(spec)));
  }
  for (const auto& [spec, times] : counts) {
    INFO(spec);
    CHECK(times == 3);
  }
  struct stat info {};
  REQUIRE(::stat(manifest.c_str(), &info) == 0);
  CHECK((info.st_mode & 022) == 0);  // only its owner may write what `kiln warm` compiles
}

TEST_CASE("an unwritable KILN_RECORD file is one warning, never a failure of the call",
          "[runtime]") {
  kiln::test::TempDir dir;
  kiln::test::write_file(dir.path() / "file", "not a directory");
  // NOTE: tests run as root, which ignores permission bits; a regular file as parent fails for
  // everyone (ENOTDIR).
  const fs::path manifest = dir.path() / "file" / "specs.manifest";
  kiln::Options options = kiln::test::isolated_options(dir.path() / "cache", "sm_80");
  kiln::Runtime plain(options);
  options.record = manifest;
  kiln::test::CapturedStderr captured;
  kiln::Runtime rt(options);
  for (const kiln::KernelSpec& spec : specs()) {
    // The call fails as it does without recording (no device of sm_80 here), not for the record.
    std::string want, got;
    try {
      plain.kernel(spec);
    } catch (const kiln::Error& e) {
      want = e.what();
    }
    try {
      rt.kernel(spec);
    } catch (const kiln::Error& e) {
      got = e.what();
    }
    CHECK(got == want);
  }
  const std::string text = captured.text();
  INFO(text);
  CHECK(kiln::test::count_of(text, "KILN_RECORD") == 1);
  CHECK(kiln::test::contains(text, manifest.string()));
  CHECK(kiln::test::contains(text, "Not a directory"));
}

TEST_CASE("KILN_RECORD writes a user variant's code beside the record and declares it",
          "[runtime][variant]") {
  kiln::test::TempDir dir;
  const fs::path manifest = dir.path() / "specs.manifest";
  kiln::Options options = kiln::test::isolated_options(dir.path() / "cache", "sm_90a");
  options.record = manifest;
  kiln::Runtime rt(options);
  const kiln::Variant variant{.name = "shift", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords&,
                                float logit) { return logit + v.scalars[0]; }
};)"};
  const kiln::AttentionProblem problem{.head_dim = 128, .head_dim_v = 128, .variant = &variant};
  kiln::KernelSpec with_variant = kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
  const kiln::DecodeProblem decode_problem{
      .head_dim = 128, .head_dim_v = 128, .rows_per_kv_head = 4, .variant = &variant};
  kiln::KernelSpec decode =
      kiln::decode_specs(decode_problem, kiln::choose(decode_problem, "sm_90a", 132))[0];
  for (const kiln::KernelSpec& spec : {with_variant, specs()[0], decode, with_variant}) {
    try {
      rt.kernel(spec);  // compiles, then finds no device of sm_90a here (or loads on one)
    } catch (const kiln::Error&) {
    }
  }
  const std::string text = kiln::test::read_file(manifest);
  INFO(text);
  // The code once, in a file named by the variant and its hash, declared once before its specs.
  const std::string file =
      "specs.manifest.variants/shift-" + kiln::variant_hash(variant.code) + ".cuh";
  CHECK(kiln::test::read_file(dir.path() / file) == variant.code);
  CHECK(text.find("variant shift " + file + "\n") == 0);
  CHECK(text.find("\nvariant ") == std::string::npos);
  // The record reads back as the specs the run asked for, the variant's code included.
  const std::vector<kiln::KernelSpec> parsed = kiln::detail::read_manifest(manifest);
  REQUIRE(parsed.size() == 3);
  for (kiln::KernelSpec* spec : {&with_variant, &decode}) spec->target = "sm_90a";
  kiln::KernelSpec plain = specs()[0];
  plain.target = "sm_90a";
  CHECK(kiln::to_string(parsed[0]) == kiln::to_string(with_variant));
  CHECK(parsed[0].variant_code == variant.code);
  CHECK(kiln::to_string(parsed[1]) == kiln::to_string(plain));
  CHECK(kiln::to_string(parsed[2]) == kiln::to_string(decode));
  CHECK(parsed[2].variant_code == variant.code);
}
