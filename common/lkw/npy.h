// Minimal .npy reader and writer (format 1.0/2.0, little-endian, C order). Narrow float formats
// travel as their raw bits (uint16 for BF16/FP16, uint8 for FP8): the logical dtype is carried
// beside the file (in the golden manifest), not guessed from numpy's descr.
#pragma once
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace lkw {

struct NpyArray {
  std::string descr;            // e.g. "<f4", "<u2", "|u1"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;   // raw data, C order
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

inline NpyArray npy_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[6];
  f.read(magic, 6);
  if (std::string(magic, 6) != "\x93NUMPY") throw std::runtime_error(path + ": not a .npy file");
  uint8_t ver[2];
  f.read(reinterpret_cast<char*>(ver), 2);
  uint32_t header_len = 0;
  if (ver[0] == 1) {
    uint8_t b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    uint8_t b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(header_len, ' ');
  f.read(&header[0], header_len);

  auto value_of = [&](const std::string& key) {
    auto k = header.find("'" + key + "'");
    if (k == std::string::npos) throw std::runtime_error(path + ": header lacks " + key);
    return header.substr(header.find(':', k) + 1);
  };
  NpyArray a;
  std::string d = value_of("descr");
  auto q0 = d.find('\''), q1 = d.find('\'', q0 + 1);
  a.descr = d.substr(q0 + 1, q1 - q0 - 1);
  if (value_of("fortran_order").find("False") == std::string::npos)
    throw std::runtime_error(path + ": Fortran order is not supported");
  std::string s = value_of("shape");
  s = s.substr(s.find('(') + 1, s.find(')') - s.find('(') - 1);
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (item.find_first_of("0123456789") != std::string::npos) a.shape.push_back(std::stoll(item));
  int item_size = std::stoi(a.descr.substr(2));
  a.bytes.resize(static_cast<size_t>(a.numel()) * item_size);
  f.read(reinterpret_cast<char*>(a.bytes.data()), a.bytes.size());
  if (!f) throw std::runtime_error(path + ": truncated data");
  return a;
}

inline void npy_write(const std::string& path, const std::string& descr,
                      const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  std::ostringstream h;
  h << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) h << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  h << "), }";
  std::string header = h.str();
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.put(char(len & 0xff));
  f.put(char(len >> 8));
  f.write(header.data(), header.size());
  f.write(static_cast<const char*>(data), bytes);
}

}  // namespace lkw
