// pico inspect: the metadata and tensor table of a GGUF (split models included),
// in the spirit of llama.cpp's gguf-dump. Reads nothing beyond the headers.
// `pico inspect --devices`: the compute devices this build can run stages on.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "backend/devices.hpp"
#include "commands.hpp"
#include "gguf/reader.hpp"
#include "model/layer_split.hpp"

namespace pico::cli {
namespace {

struct InspectOptions {
  std::string model_path;
  bool show_kv = false;
  bool show_tensors = false;
  size_t array_items = 8;
  int split = 0;  // > 0: print only the balanced layer ranges for that many stages
  bool devices = false;
};

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? " x " : "") + std::to_string(shape[i]);
  return out;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

void print_summary(const gguf::Model& model, std::ostream& out) {
  uint64_t total_bytes = 0, total_elements = 0;
  std::map<std::string, size_t> tensors_per_type;
  for (const gguf::TensorInfo& tensor : model.tensors()) {
    total_bytes += tensor.bytes;
    total_elements += tensor.elements;
    ++tensors_per_type[std::string(type_traits(tensor.type).name)];
  }
  out << fmt::format("GGUF v{}, {} byte order, alignment {}, {} file(s)\n", model.version(),
                     model.big_endian() ? "big-endian" : "little-endian", model.alignment(), model.file_count());
  if (auto arch = model.metadata().get_string("general.architecture")) out << "architecture: " << *arch << "\n";
  if (auto name = model.metadata().get_string("general.name")) out << "name: " << *name << "\n";
  out << fmt::format("{} metadata keys, {} tensors, {} parameters, {}\n", model.metadata().size(),
                     model.tensors().size(), total_elements, human_bytes(total_bytes));
  out << "tensor types:";
  for (const auto& [type, count] : tensors_per_type) out << " " << type << "=" << count;
  out << "\n";
}

void print_metadata(const gguf::Model& model, size_t array_items, std::ostream& out) {
  out << fmt::format("\n{} key/value pairs:\n", model.metadata().size());
  size_t index = 0;
  for (const auto& [key, value] : model.metadata().entries()) {
    std::string type(gguf::value_type_name(value.type()));
    std::string count = "1";
    if (const gguf::Array* array = value.array()) {
      type += "[" + std::string(gguf::value_type_name(array->element_type)) + "]";
      count = std::to_string(array->items.size());
    }
    out << fmt::format("{:>6}: {:<14} {:>8} | {} = {}\n", ++index, type, count, key,
                       gguf::to_display_string(value, array_items));
  }
}

void print_tensors(const gguf::Model& model, std::ostream& out) {
  out << fmt::format("\n{} tensors:\n", model.tensors().size());
  out << fmt::format("{:>6}  {:<32} {:<8} {:<24} {:>12} {:>14}{}\n", "#", "name", "type", "shape", "bytes",
                     "offset", model.file_count() > 1 ? "  file" : "");
  size_t index = 0;
  for (const gguf::TensorInfo& tensor : model.tensors()) {
    out << fmt::format("{:>6}  {:<32} {:<8} {:<24} {:>12} {:>#14x}", ++index, tensor.name,
                       type_traits(tensor.type).name, shape_string(tensor.shape), tensor.bytes, tensor.file_offset);
    if (model.file_count() > 1) out << fmt::format("  {}", tensor.file_index + 1);
    out << "\n";
  }
}

// One line per device (`--device N` takes its index), then its limits; a backend
// without a device says why. Unusable devices are listed with the reason.
void print_devices(std::ostream& out) {
  const backend::DeviceListing listing = backend::list_compute_devices();
  for (const backend::ComputeDevice& device : listing.devices) {
    out << fmt::format("{} {}: {} ({}), {}, {} memory, {}\n", device.backend, device.index, device.name, device.type,
                       device.driver, human_bytes(device.memory_bytes),
                       device.usable ? "usable" : "not usable: " + device.unusable_reason);
    std::string limits;
    for (const auto& [label, value] : device.limits) limits += (limits.empty() ? "" : ", ") + label + " " + value;
    if (!limits.empty()) out << "    " << limits << "\n";
  }
  for (const std::string& note : listing.notes) out << note << "\n";
  if (listing.devices.empty()) out << "no compute device: stages run on the CPU\n";
}

void run_inspect(const InspectOptions& options) {
  if (options.devices) {
    print_devices(std::cout);
    return;
  }
  if (options.model_path.empty()) throw std::runtime_error("give a model (-m FILE) or --devices");
  auto model = gguf::Model::open(options.model_path);
  if (options.split > 0) {
    std::cout << model::format_layer_ranges(model::balanced_layer_split(*model, options.split)) << "\n";
    return;
  }
  const bool both = !options.show_kv && !options.show_tensors;
  print_summary(*model, std::cout);
  if (options.show_kv || both) print_metadata(*model, options.array_items, std::cout);
  if (options.show_tensors || both) print_tensors(*model, std::cout);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* command = app.add_subcommand("inspect", "Print a GGUF's metadata and tensor table (reads headers only)");
  command->add_option("-m,--model", options->model_path, "GGUF file (first part of a split model)")
      ->check(CLI::ExistingFile);
  command->add_flag("--devices", options->devices,
                    "List the compute devices (Vulkan) this build can run stages on, with their memory and limits");
  command->add_flag("--kv", options->show_kv, "Print the metadata (default: metadata and tensors)");
  command->add_flag("--tensors", options->show_tensors, "Print the tensor table");
  command->add_option("--split", options->split,
                      "Print only the layer ranges (\"0-6,7-11\") of N pipeline stages, balanced by the weight "
                      "bytes each reads per token (the output head on the last)")
      ->check(CLI::Range(1, 4096));
  command->add_option("--array-items", options->array_items, "Array items shown before abbreviating")
      ->default_val(8);
  command->callback([options] { run_inspect(*options); });
}

}  // namespace pico::cli
