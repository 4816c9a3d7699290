// From token ids back to text, with the vocabulary the GGUF file carries
// (tokenizer.ggml.tokens). Turning text into ids (BPE merges, SentencePiece) is left to the
// model's own tokenizer: scripts/models/generate.py hands the runner the ids.
//
// Two spellings of a token's bytes:
// - "gpt2" (SmolLM2's byte-level BPE): each byte is one printable code point, bytes 33-126,
//   161-172 and 174-255 as themselves and the other 68 as U+0100 onward, in byte order.
// - "llama" (Gemma's SentencePiece): "▁" (U+2581) stands for a space, and a byte the
//   vocabulary has no piece for is a token "<0xAB>".
// Control tokens (<bos>, <eos>, type 3) print nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf.hpp"

namespace model {

class Vocab {
 public:
  explicit Vocab(const GgufFile& file)
      : pieces_(file.strings("tokenizer.ggml.tokens")),
        byte_level_(file.text("tokenizer.ggml.model") == "gpt2") {
    if (file.has("tokenizer.ggml.token_type")) types_ = file.integers("tokenizer.ggml.token_type");
    if (byte_level_) {
      for (int& b : byte_of_) b = -1;
      int next = 256;
      for (int byte = 0; byte < 256; ++byte) {
        const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) ||
                               (byte >= 174 && byte <= 255);
        byte_of_[printable ? byte : next++] = byte;
      }
    }
  }

  std::int64_t size() const { return static_cast<std::int64_t>(pieces_.size()); }

  std::string text(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += bytes(id);
    return out;
  }

  /// The bytes of one token.
  std::string bytes(int id) const {
    if (id < 0 || id >= size()) return "";
    if (static_cast<std::size_t>(id) < types_.size() && types_[id] == 3) return "";  // control
    const std::string& piece = pieces_[static_cast<std::size_t>(id)];
    if (!byte_level_) {
      if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>')
        return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
      std::string out;
      for (std::size_t i = 0; i < piece.size(); ++i) {
        if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {  // U+2581, SentencePiece's space
          out += ' ';
          i += 2;
        } else {
          out += piece[i];
        }
      }
      return out;
    }
    std::string out;  // byte-level: one code point of the piece per byte
    for (std::size_t i = 0; i < piece.size();) {
      const auto c = static_cast<unsigned char>(piece[i]);
      int code = c, extra = 0;
      if (c >= 0xC0) {
        extra = c >= 0xE0 ? 2 : 1;
        code = c & (extra == 2 ? 0x0F : 0x1F);
      }
      for (int k = 1; k <= extra && i + k < piece.size(); ++k)
        code = (code << 6) | (static_cast<unsigned char>(piece[i + k]) & 0x3F);
      i += static_cast<std::size_t>(extra) + 1;
      if (code < 324 && byte_of_[code] >= 0) out += static_cast<char>(byte_of_[code]);
    }
    return out;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<std::int64_t> types_;
  bool byte_level_;
  int byte_of_[324] = {};  // code point -> byte (-1: none), for the byte-level spelling
};

}  // namespace model
