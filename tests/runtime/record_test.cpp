// SPDX-License-Identifier: Apache-2.0
// KILN_RECORD and Options::record: the specs Runtime::kernel is asked for, appended to a manifest
// by many threads and processes at once; an unwritable file is one warning, never a failure.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
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

// A runtime of sm_90a that never compiles, so that each call is refused quickly after its spec is
// recorded, in a directory of the test's own.
struct Recording {
  kiln::test::TempDir dir;
  kiln::Options options = [this] {
    kiln::Options made = kiln::test::isolated_options(dir.path() / "cache", "sm_90a");
    made.jit = kiln::JitMode::off;
    return made;
  }();
  kiln::Variant variant{.name = "shift", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords&,
                                float logit) { return logit + v.scalars[0]; }
};)"};

  kiln::KernelSpec with_variant() const {
    const kiln::AttentionProblem problem{.head_dim = 128, .head_dim_v = 128, .variant = &variant};
    return kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
  }

  // What asking a runtime of `options` for `spec` throws: the same, recorded or not.
  static std::string error_of(const kiln::Options& options, const kiln::KernelSpec& spec) {
    kiln::Runtime rt(options);
    try {
      rt.kernel(spec);
    } catch (const kiln::Error& e) {
      return fmt::format("{}: {}", static_cast<int>(e.category()), e.what());
    }
    return "no error";
  }

  // Asks for `spec` recording to `record`, and checks that the call fails as it does unrecorded.
  void ask(const fs::path& record, const kiln::KernelSpec& spec) const {
    kiln::Options recording = options;
    recording.record = record;
    CHECK(error_of(recording, spec) == error_of(options, spec));
  }

  // What recording a variant's spec, then a plain one, to `record` writes to stderr, which
  // must be one warning saying `why`.
  void warns_once(const fs::path& record, std::string_view why) const {
    kiln::test::CapturedStderr captured;
    ask(record, with_variant());
    ask(record, specs()[0]);
    const std::string text = captured.text();
    INFO(text);
    CHECK(kiln::test::count_of(text, "kiln warn:") == 1);
    CHECK(kiln::test::contains(text, why));
  }
};

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

TEST_CASE("a FIFO as the KILN_RECORD file is one warning, and never waited on", "[runtime]") {
  Recording recording;
  const fs::path fifo = recording.dir.path() / "specs.manifest";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // In a child, so that a call that waits for a reader fails the test instead of hanging it.
  CHECK(kiln::test::in_process_within(std::chrono::seconds(30), [&] {
    kiln::test::CapturedStderr captured;
    recording.ask(fifo, specs()[0]);
    recording.ask(fifo, specs()[1]);
    const std::string text = captured.text();
    return kiln::test::count_of(text, "kiln warn:") == 1 &&
           kiln::test::contains(text, fifo.string() + ": it is not a regular file");
  }));
}

TEST_CASE("a file in the place of RECORD.variants is one warning, and the record still warms",
          "[runtime][variant]") {
  Recording recording;
  const fs::path manifest = recording.dir.path() / "specs.manifest";
  kiln::test::write_file(recording.dir.path() / "specs.manifest.variants", "in the way");
  recording.warns_once(manifest, "specs.manifest.variants (Not a directory)");
  // The spec whose code could not be written is left out, so the record reads back.
  const std::vector<kiln::KernelSpec> parsed = kiln::detail::read_manifest(manifest);
  REQUIRE(parsed.size() == 1);
  kiln::KernelSpec plain = specs()[0];
  plain.target = "sm_90a";
  CHECK(kiln::to_string(parsed[0]) == kiln::to_string(plain));
}

TEST_CASE("a variant's name of 250 characters is recorded under a shorter file name",
          "[runtime][variant]") {
  Recording recording;
  recording.variant.name = "v" + std::string(249, 'x');
  const fs::path manifest = recording.dir.path() / "specs.manifest";
  kiln::test::CapturedStderr captured;
  recording.ask(manifest, recording.with_variant());
  CHECK(captured.text().empty());
  const std::vector<kiln::KernelSpec> parsed = kiln::detail::read_manifest(manifest);
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].variant_name == recording.variant.name);
  CHECK(parsed[0].variant_code == recording.variant.code);
}

TEST_CASE("KILN_RECORD writes through no link, and not in another user's directory or file",
          "[runtime][variant]") {
  Recording recording;
  const fs::path victim = recording.dir.path() / "victim";
  kiln::test::write_file(victim, "the victim's file");
  const fs::path manifest = recording.dir.path() / "specs.manifest";
  const fs::path variants = recording.dir.path() / "specs.manifest.variants";
  const kiln::KernelSpec spec = recording.with_variant();
  std::string topic;

  SECTION("RECORD.variants made by another user, with links at the names kiln would write") {
    const std::string file = "shift-" + kiln::variant_hash(recording.variant.code) + ".cuh";
    fs::create_directory(variants);
    fs::create_symlink(victim, variants / file);
    fs::create_symlink(victim, variants / fmt::format("{}.{}.tmp", file, ::getpid()));
    topic = kiln::test::make_foreign(variants);
  }
  SECTION("the record made by another user, writable by everyone") {
    kiln::test::write_file(manifest, "");
    topic = kiln::test::make_foreign(manifest);
  }
  SECTION("the record a link to another file") {
    fs::create_symlink(victim, manifest);
    topic = "symbolic link";
  }
  kiln::test::CapturedStderr captured;
  recording.ask(manifest, spec);
  recording.ask(manifest, specs()[0]);
  const std::string text = captured.text();
  INFO(text);
  CHECK(kiln::test::count_of(text, "kiln warn:") == 1);
  CHECK(kiln::test::contains(text, topic));
  CHECK(kiln::test::read_file(victim) == "the victim's file");
}

TEST_CASE("a KILN_RECORD file name that `kiln warm` could not read back is refused",
          "[runtime][variant]") {
  Recording recording;
  const std::string name =
      GENERATE(as<std::string>{}, "a#b.manifest", "a\nb.manifest", " leading.manifest");
  const fs::path manifest = recording.dir.path() / name;
  recording.warns_once(manifest, "`kiln warm` cannot read");
  CHECK_FALSE(fs::exists(manifest));
  // A '#' in a directory's name is no trouble: only the file's name goes into the record.
  const fs::path in_dir = recording.dir.path() / "a#b" / "specs.manifest";
  fs::create_directory(in_dir.parent_path());
  recording.ask(in_dir, recording.with_variant());
  CHECK(kiln::detail::read_manifest(in_dir).size() == 1);
}
