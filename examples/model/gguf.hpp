// A GGUF file (llama.cpp's model format, version 3), read the way a model runner needs it:
// the metadata (architecture, sizes, RoPE base, the vocabulary) and the tensors, each
// dequantized to f32 at load. The file is mapped read-only; nothing of it is kept after load.
//
// Layout: "GGUF", version, tensor count, metadata count; the metadata as (key, type, value);
// the tensor infos as (name, dims, type, offset); then, aligned to general.alignment (32),
// the tensor data. A tensor's dims run fastest first: a weight [out, in] is stored with
// dims {in, out}, so its rows are the output features, as a row-major [out][in] matrix.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "gguf_blocks.hpp"

namespace model {

/// One metadata value: a number, a string, or an array of numbers or strings.
using MetaValue = std::variant<std::int64_t, double, std::string, std::vector<std::int64_t>,
                               std::vector<double>, std::vector<std::string>>;

struct TensorInfo {
  std::vector<std::int64_t> dims;  // fastest first
  GgmlType type;
  std::uint64_t offset;  // from the start of the data section
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("gguf: cannot open " + path);
    struct stat st {};
    ::fstat(fd, &st);
    size_ = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error("gguf: cannot map " + path);
    base_ = static_cast<const unsigned char*>(p);
    parse();
  }
  ~GgufFile() { ::munmap(const_cast<unsigned char*>(base_), size_); }
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  std::int64_t integer(const std::string& key) const { return std::get<std::int64_t>(value(key)); }
  double number(const std::string& key) const {
    const MetaValue& v = value(key);
    return std::holds_alternative<double>(v) ? std::get<double>(v)
                                             : double(std::get<std::int64_t>(v));
  }
  const std::string& text(const std::string& key) const {
    return std::get<std::string>(value(key));
  }
  const std::vector<std::string>& strings(const std::string& key) const {
    return std::get<std::vector<std::string>>(value(key));
  }
  const std::vector<std::int64_t>& integers(const std::string& key) const {
    return std::get<std::vector<std::int64_t>>(value(key));
  }

  bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw std::runtime_error("gguf: no tensor " + name + " in " + path_);
    return it->second;
  }

  /// The tensor dequantized to f32, in its stored order (rows of dims[0] values).
  std::vector<float> load(const std::string& name) const {
    const TensorInfo& t = tensor(name);
    std::int64_t count = 1;
    for (std::int64_t d : t.dims) count *= d;
    std::vector<float> out(static_cast<std::size_t>(count));
    const std::size_t bytes = row_bytes(t.type, count);
    if (data_ + t.offset + bytes > size_) throw std::runtime_error("gguf: " + name + " truncated");
    dequantize(t.type, base_ + data_ + t.offset, count, out.data());
    return out;
  }

 private:
  const MetaValue& value(const std::string& key) const {
    const auto it = meta_.find(key);
    if (it == meta_.end()) throw std::runtime_error("gguf: no key " + key + " in " + path_);
    return it->second;
  }

  template <class T>
  T read() {
    if (at_ + sizeof(T) > size_) throw std::runtime_error("gguf: truncated header in " + path_);
    T v;
    std::memcpy(&v, base_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string read_string() {
    const auto n = read<std::uint64_t>();
    if (n > size_ - at_) throw std::runtime_error("gguf: bad string length in " + path_);
    std::string s(reinterpret_cast<const char*>(base_ + at_), n);
    at_ += n;
    return s;
  }
  // GGUF value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
  // 9 array, 10 u64, 11 i64, 12 f64.
  std::int64_t read_integer(std::uint32_t type) {
    switch (type) {
      case 0:
        return read<std::uint8_t>();
      case 1:
        return read<std::int8_t>();
      case 2:
        return read<std::uint16_t>();
      case 3:
        return read<std::int16_t>();
      case 4:
        return read<std::uint32_t>();
      case 5:
        return read<std::int32_t>();
      case 7:
        return read<std::uint8_t>();
      case 10:
        return static_cast<std::int64_t>(read<std::uint64_t>());
      case 11:
        return read<std::int64_t>();
      default:
        throw std::runtime_error("gguf: unknown value type in " + path_);
    }
  }
  MetaValue read_value(std::uint32_t type) {
    if (type == 6) return double(read<float>());
    if (type == 12) return read<double>();
    if (type == 8) return read_string();
    if (type != 9) return read_integer(type);
    const auto item = read<std::uint32_t>();
    const auto n = read<std::uint64_t>();
    if (item == 8) {
      std::vector<std::string> v;
      for (std::uint64_t i = 0; i < n; ++i) v.push_back(read_string());
      return v;
    }
    if (item == 6 || item == 12) {
      std::vector<double> v;
      for (std::uint64_t i = 0; i < n; ++i)
        v.push_back(item == 6 ? double(read<float>()) : read<double>());
      return v;
    }
    std::vector<std::int64_t> v;
    for (std::uint64_t i = 0; i < n; ++i) v.push_back(read_integer(item));
    return v;
  }

  void parse() {
    if (size_ < 24 || std::memcmp(base_, "GGUF", 4) != 0)
      throw std::runtime_error("gguf: " + path_ + " is not a GGUF file");
    at_ = 4;
    if (read<std::uint32_t>() != 3) throw std::runtime_error("gguf: only version 3 is read");
    const auto tensor_count = read<std::uint64_t>();
    const auto meta_count = read<std::uint64_t>();
    for (std::uint64_t i = 0; i < meta_count; ++i) {
      std::string key = read_string();
      const auto type = read<std::uint32_t>();
      meta_[key] = read_value(type);
    }
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
      std::string name = read_string();
      TensorInfo t;
      const auto n_dims = read<std::uint32_t>();
      for (std::uint32_t d = 0; d < n_dims; ++d)
        t.dims.push_back(static_cast<std::int64_t>(read<std::uint64_t>()));
      t.type = static_cast<GgmlType>(read<std::uint32_t>());
      t.offset = read<std::uint64_t>();
      tensors_[name] = t;
    }
    const std::uint64_t align = has("general.alignment") ? integer("general.alignment") : 32;
    data_ = (at_ + align - 1) / align * align;
  }

  std::string path_;
  const unsigned char* base_ = nullptr;
  std::size_t size_ = 0, at_ = 0, data_ = 0;
  std::map<std::string, MetaValue> meta_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace model
