// SPDX-License-Identifier: Apache-2.0
// The elementwise family on a GPU: every op and dtype against a double-precision CPU reference,
// bit-identical across configs, odd sizes, memory and disk hits, strict mode, bad arguments.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "gpu.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::DType;
using kiln::UnaryOp;

constexpr UnaryOp kOps[] = {UnaryOp::neg,  UnaryOp::abs,  UnaryOp::exp,  UnaryOp::log,
                            UnaryOp::sin,  UnaryOp::cos,  UnaryOp::tanh, UnaryOp::sigmoid,
                            UnaryOp::relu, UnaryOp::gelu, UnaryOp::silu, UnaryOp::sqrt};

double reference(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sin: return std::sin(x);
    case UnaryOp::cos: return std::cos(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::relu: return x > 0 ? x : 0.0;
    case UnaryOp::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::silu: return x / (1.0 + std::exp(-x));
    case UnaryOp::sqrt: return std::sqrt(x);
  }
  return NAN;
}

// Host images of the device formats: stored values, converted to double exactly.
std::uint16_t to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double from_bf16(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

struct HostData {
  std::vector<std::byte> bytes;  // the input as stored on the device
  std::vector<double> values;    // the same values, exactly
};

HostData random_input(DType dtype, std::size_t n, UnaryOp op, std::mt19937& rng) {
  const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
  std::uniform_real_distribution<double> dist(positive ? 0.01 : -4.0, 4.0);
  HostData data;
  data.bytes.resize(n * kiln::size_of(dtype));
  data.values.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = dist(rng);
    switch (dtype) {
      case DType::f16: {
        const auto h = static_cast<_Float16>(x);
        std::memcpy(&data.bytes[i * 2], &h, 2);
        data.values[i] = static_cast<double>(h);
        break;
      }
      case DType::bf16: {
        const std::uint16_t b = to_bf16(static_cast<float>(x));
        std::memcpy(&data.bytes[i * 2], &b, 2);
        data.values[i] = from_bf16(b);
        break;
      }
      case DType::f32: {
        const auto f = static_cast<float>(x);
        std::memcpy(&data.bytes[i * 4], &f, 4);
        data.values[i] = f;
        break;
      }
      default: {
        std::memcpy(&data.bytes[i * 8], &x, 8);
        data.values[i] = x;
      }
    }
  }
  return data;
}

double stored_value(DType dtype, const std::vector<std::byte>& bytes, std::size_t i) {
  switch (dtype) {
    case DType::f16: {
      _Float16 h;
      std::memcpy(&h, &bytes[i * 2], 2);
      return static_cast<double>(h);
    }
    case DType::bf16: {
      std::uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      return from_bf16(b);
    }
    case DType::f32: {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, &bytes[i * 8], 8);
      return d;
    }
  }
}

// Rounding of the stored format plus a few ulp of the device's float math.
double tolerance(DType dtype, double ref) {
  const double eps = dtype == DType::f16    ? 0x1p-11
                     : dtype == DType::bf16 ? 0x1p-8
                     : dtype == DType::f32  ? 0x1p-23 * 4
                                            : 0x1p-52 * 4;
  return eps * std::fabs(ref) + (dtype == DType::f64 ? 1e-14 : dtype == DType::f32 ? 1e-6 : 1e-3);
}

kiln::Options options_for(const fs::path& cache) {
  return kiln::test::isolated_options(cache);
}

// Runs one op and returns the output bytes; the output is poisoned first.
std::vector<std::byte> run(kiln::Runtime& rt, UnaryOp op, DType dtype, const HostData& input,
                           const kiln::UnaryConfig& config) {
  const std::size_t n = input.values.size();
  kiln::test::DeviceBuffer in(input.bytes.size()), out(input.bytes.size());
  in.upload(input.bytes);
  out.poison();
  kiln::unary({.op = op,
               .dtype = dtype,
               .in = in.get(),
               .out = out.get(),
               .n = static_cast<std::int64_t>(n)},
              config, rt);
  kiln::test::sync_and_check();
  return out.download<std::byte>();
}

}  // namespace

TEST_CASE("every op and dtype matches a double reference, bit-identical for every config",
          "[gpu][elementwise]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  std::mt19937 rng(20261122);
  const std::vector<kiln::UnaryConfig> configs = {{64, 1}, {128, 4}, {256, 4}, {1024, 16}};
  for (DType dtype : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    for (UnaryOp op : kOps) {
      INFO(kiln::to_string(op) << " " << kiln::to_string(dtype));
      const HostData input = random_input(dtype, 4099, op, rng);
      const std::vector<std::byte> first = run(rt, op, dtype, input, configs[0]);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < input.values.size(); ++i) {
        const double ref = reference(op, input.values[i]);
        const double got = stored_value(dtype, first, i);
        if (!(std::fabs(got - ref) <= tolerance(dtype, ref))) {
          if (bad++ < 3)
            WARN("element " << i << ": x=" << input.values[i] << " got " << got << " want " << ref);
        }
      }
      CHECK(bad == 0);
      for (std::size_t c = 1; c < configs.size(); ++c) {
        INFO("block " << configs[c].block_size << " items " << configs[c].items_per_thread);
        CHECK(run(rt, op, dtype, input, configs[c]) == first);
      }
    }
  }
}

TEST_CASE("odd sizes are covered exactly, with nothing written past the end",
          "[gpu][elementwise]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  std::mt19937 rng(7);
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{17}, (std::size_t{1} << 20) + 3}) {
    INFO("n = " << n);
    const HostData input = random_input(DType::f32, n, UnaryOp::sin, rng);
    // One guard element past the end stays poisoned.
    kiln::test::DeviceBuffer in(4 * n + 4), out(4 * n + 4);
    std::vector<std::byte> padded = input.bytes;
    padded.resize(4 * n + 4);
    in.upload(padded);
    out.poison();
    kiln::unary({.op = UnaryOp::sin,
                 .dtype = DType::f32,
                 .in = in.get(),
                 .out = out.get(),
                 .n = static_cast<std::int64_t>(n)},
                {128, 4}, rt);
    kiln::test::sync_and_check();
    const auto got = out.download<std::uint32_t>();
    CHECK(got[n] == 0xFFFFFFFFu);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double ref = std::sin(input.values[i]);
      if (!(std::fabs(std::bit_cast<float>(got[i]) - ref) <= tolerance(DType::f32, ref))) ++bad;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("kernels launch from memory hits and from disk hits in a fresh runtime",
          "[gpu][elementwise]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  std::mt19937 rng(11);
  const HostData input = random_input(DType::bf16, 1000, UnaryOp::gelu, rng);
  std::vector<std::byte> first;
  {
    kiln::Runtime rt(options_for(dir.path()));
    first = run(rt, UnaryOp::gelu, DType::bf16, input, {256, 4});
    CHECK(rt.stats().compiles == 1);
    CHECK(run(rt, UnaryOp::gelu, DType::bf16, input, {256, 4}) == first);
    CHECK(rt.stats().memory_hits >= 1);
    CHECK(rt.stats().compiles == 1);
  }
  kiln::Runtime fresh(options_for(dir.path()));
  CHECK(run(fresh, UnaryOp::gelu, DType::bf16, input, {256, 4}) == first);
  CHECK(fresh.stats().disk_hits == 1);
  CHECK(fresh.stats().compiles == 0);
  CHECK(fresh.stats().loads == 1);
}

TEST_CASE("strict mode refuses a hot-path compile until warm-up has run", "[gpu][elementwise]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  auto options = options_for(dir.path());
  options.jit = kiln::JitMode::strict;
  kiln::Runtime rt(options);
  const kiln::KernelSpec spec = kiln::unary_spec(UnaryOp::tanh, DType::f16, {256, 4});
  try {
    rt.kernel(spec);
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("KILN_JIT=strict"));
  }
  const auto report = rt.warmup(std::vector<kiln::KernelSpec>{spec});
  CHECK(report.count(kiln::WarmupStatus::compiled) == 1);
  CHECK(rt.kernel(spec));
  CHECK(rt.stats().memory_hits >= 1);
}

TEST_CASE("bad arguments are refused with the value named", "[gpu][elementwise]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  kiln::test::DeviceBuffer buffer(64);
  const auto message = [&](kiln::UnaryArgs args, kiln::UnaryConfig config = {256, 4}) {
    try {
      kiln::unary(args, config, rt);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message({.in = buffer.get(), .out = buffer.get(), .n = -1}),
             Catch::Contains("n is -1"));
  CHECK_THAT(message({.in = nullptr, .out = buffer.get(), .n = 4}), Catch::Contains("null in"));
  CHECK_THAT(message({.dtype = DType::i32, .in = buffer.get(), .out = buffer.get(), .n = 4}),
             Catch::Contains("dtype i32"));
  CHECK_THAT(message({.in = buffer.get(), .out = buffer.get(), .n = 4}, {100, 4}),
             Catch::Contains("block_size is 100"));
  CHECK_THAT(message({.in = buffer.get(), .out = buffer.get(), .n = 4}, {256, 0}),
             Catch::Contains("items_per_thread is 0"));
  const kiln::Kernel kernel = rt.kernel(kiln::unary_spec(UnaryOp::neg, DType::f32, {256, 4}));
  const int wrong = 0;
  try {
    kernel.launch({.grid = {1}, .block = {256}}, wrong);
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("4 bytes"));
  }
}
