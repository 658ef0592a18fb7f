// SPDX-License-Identifier: Apache-2.0
// Names a mistyped subcommand, and the one meant, before CLI11 parses (it says only "A
// subcommand is required").
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "cli/commands.hpp"

namespace kiln::cli {
namespace {

// Levenshtein distance: the fewest inserted, deleted or replaced characters from `a` to `b`.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The message for `word`, which names none of `command`'s subcommands.
std::string unknown(const CLI::App& command, const std::string& prefix, std::string_view word) {
  const std::vector<const CLI::App*> subs = subcommands_of(command);
  const CLI::App* nearest = nullptr;
  std::size_t best = 3;  // a suggestion more than two edits away is a guess
  std::vector<std::string> names;
  for (const CLI::App* sub : subs) {
    const std::string& name = sub->get_name();
    names.push_back(name);
    const std::size_t distance = name.starts_with(word) ? 0 : edit_distance(word, name);
    if (distance < best) {
      best = distance;
      nearest = sub;
    }
  }
  if (nearest) {
    return fmt::format("unknown command '{}{}'; did you mean '{}{}'?", prefix, word, prefix,
                       nearest->get_name());
  }
  return fmt::format("unknown command '{}{}': the commands are {}{}", prefix, word, prefix,
                     fmt::join(names, fmt::format(", {}", prefix)));
}

}  // namespace

std::vector<const CLI::App*> subcommands_of(const CLI::App& command) {
  return command.get_subcommands([](const CLI::App* sub) { return !sub->get_name().empty(); });
}

std::variant<const CLI::App*, std::string> named_command(const CLI::App& app,
                                                         const std::vector<std::string>& words) {
  const CLI::App* command = &app;
  std::string prefix;
  for (const std::string& word : words) {
    const std::vector<const CLI::App*> subs = subcommands_of(*command);
    const auto found = std::find_if(subs.begin(), subs.end(),
                                    [&](const CLI::App* sub) { return sub->check_name(word); });
    if (found == subs.end()) return unknown(*command, prefix, word);
    command = *found;
    prefix += word + " ";
  }
  return command;
}

std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv) {
  // NOTE: kiln's commands that hold subcommands take no option with a value, so the first word
  // that is not an option names the subcommand; below a leaf, words are the leaf's own.
  const CLI::App* command = &app;
  std::vector<std::string> words;
  for (int i = 1; i < argc && !subcommands_of(*command).empty(); ++i) {
    const std::string_view word = argv[i];
    if (word == "--") break;
    if (word.starts_with('-')) continue;
    words.emplace_back(word);
    const auto named = named_command(app, words);
    if (const auto* error = std::get_if<std::string>(&named)) return *error;
    command = std::get<const CLI::App*>(named);
  }
  return std::nullopt;
}

}  // namespace kiln::cli
