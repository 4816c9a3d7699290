// A small decoder runner: a real checkpoint (SmolLM2-135M, Gemma 3 270M) read from its GGUF
// file, every attention call through attnkit, greedy generation from token ids.
//
//   model_runner --model FILE.gguf --ids "1 2 3" [--new 32] [--cache f32|bf16|q8_0]
//                [--threads 2] [--force "4 5 6"] [--logits OUT.f32] [--bench 128,512,2048]
//
// --ids: the prompt's token ids (scripts/models/generate.py tokenizes text and calls this).
// --new: tokens to generate greedily; --force: feed these tokens instead of the argmax (the
//   logits are still those of the model), to compare runs on the same sequence.
// --cache: the KV cache's storage; --threads: for the matmuls and attnkit.
// --logits: writes f32 rows of vocab logits, one per predicted position: the P prompt
//   positions, then the first new - 1 generated tokens (P + new - 1 rows).
// --bench: per prompt length, prefill and decode tokens/s and the share of time in attnkit,
//   on synthetic ids (the prompt's, repeated).
// --window W, --pairing neox|gptj: override the checkpoint's window (0: every layer global)
//   or RoPE pairing; scripts/models/check.py shows with them that a convention one step off
//   fails its comparison (its negative controls).
#include <Eigen/Core>
#include <algorithm>
#include <attnkit/attnkit.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "decoder.hpp"
#include "gguf.hpp"
#include "vocab.hpp"

namespace {

struct Args {
  std::string model, cache = "f32", logits, bench, pairing;
  long window = -1;  // -1: the checkpoint's
  std::vector<int> ids, force;
  int new_tokens = 32, threads = 1;
};

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::istringstream in(text);
  for (int id = 0; in >> id;) ids.push_back(id);
  return ids;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--model")
      a.model = value;
    else if (key == "--ids")
      a.ids = parse_ids(value);
    else if (key == "--force")
      a.force = parse_ids(value);
    else if (key == "--new")
      a.new_tokens = std::stoi(value);
    else if (key == "--cache")
      a.cache = value;
    else if (key == "--threads")
      a.threads = std::stoi(value);
    else if (key == "--logits")
      a.logits = value;
    else if (key == "--bench")
      a.bench = value;
    else if (key == "--window")
      a.window = std::stol(value);
    else if (key == "--pairing")
      a.pairing = value;
    else
      throw std::runtime_error("model_runner: unknown option " + key);
  }
  if (a.model.empty()) throw std::runtime_error("model_runner: --model FILE.gguf is required");
  if (!a.force.empty()) a.new_tokens = int(a.force.size());
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int argmax(const model::Matrix& logits, Eigen::Index row) {
  Eigen::Index best = 0;
  logits.row(row).maxCoeff(&best);
  return int(best);
}

// Prefill, then greedy (or forced) decode; prints the tokens and the text.
template <class T>
void generate(const Args& a, const model::Config& c, const model::Weights& w,
              const model::Vocab& vocab) {
  const auto capacity = attnkit::Index(a.ids.size()) + a.new_tokens;
  model::Decoder<T> decoder(c, w, capacity, a.threads);
  std::ofstream dump;
  if (!a.logits.empty()) dump.open(a.logits, std::ios::binary);
  model::Matrix logits;
  const auto write = [&](const model::Matrix& rows) {
    if (dump)
      dump.write(reinterpret_cast<const char*>(rows.data()),
                 std::streamsize(rows.size() * sizeof(float)));
  };

  const auto start = std::chrono::steady_clock::now();
  decoder.forward(a.ids);
  const auto P = Eigen::Index(a.ids.size());
  if (dump)  // every prompt position, in slices of 64 rows
    for (Eigen::Index r = 0; r < P; r += 64) {
      decoder.logits(r, std::min<Eigen::Index>(64, P - r), logits);
      write(logits);
    }
  decoder.logits(P - 1, 1, logits);
  const double prefill = seconds_since(start);

  std::vector<int> out;
  const auto decode_start = std::chrono::steady_clock::now();
  for (int step = 0; step < a.new_tokens; ++step) {
    const int next = a.force.empty() ? argmax(logits, 0) : a.force[std::size_t(step)];
    out.push_back(next);
    if (step + 1 == a.new_tokens) break;
    decoder.forward({next});
    decoder.logits(0, 1, logits);
    write(logits);
  }
  const double decode = seconds_since(decode_start);
  std::printf("generated:");
  for (int id : out) std::printf(" %d", id);
  std::printf("\ntext: %s%s\n", vocab.text(a.ids).c_str(), vocab.text(out).c_str());
  std::fprintf(stderr, "prefill %ld tokens %.3f s, decode %d tokens %.3f s, attnkit %.3f s\n",
               long(P), prefill, a.new_tokens - 1, decode, decoder.attention_seconds());
}

// Per prompt length: prefill tokens/s and decode tokens/s over 32 tokens, each with the share
// of its time spent inside attnkit (cache append, RoPE of the queries, attention).
template <class T>
void bench(const Args& a, const model::Config& c, const model::Weights& w) {
  std::vector<int> source = a.ids.empty() ? std::vector<int>{1} : a.ids;
  std::istringstream lengths(a.bench);
  std::printf("%-6s %-5s %7s %6s %12s %9s %11s %9s\n", "model", "cache", "threads", "prompt",
              "prefill t/s", "attnkit%", "decode t/s", "attnkit%");
  for (std::string item; std::getline(lengths, item, ',');) {
    const int L = std::stoi(item), steps = 32;
    std::vector<int> prompt(static_cast<std::size_t>(L));
    for (int i = 0; i < L; ++i) prompt[std::size_t(i)] = source[std::size_t(i) % source.size()];
    model::Decoder<T> decoder(c, w, L + steps, a.threads);
    model::Matrix logits;
    auto start = std::chrono::steady_clock::now();
    decoder.forward(prompt);
    decoder.logits(L - 1, 1, logits);
    const double prefill = seconds_since(start), prefill_attn = decoder.attention_seconds();
    start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) {
      decoder.forward({argmax(logits, 0)});
      decoder.logits(0, 1, logits);
    }
    const double decode = seconds_since(start);
    const double decode_attn = decoder.attention_seconds() - prefill_attn;
    std::printf("%-6s %-5s %7d %6d %12.1f %8.1f%% %11.2f %8.1f%%\n", c.gemma ? "gemma3" : "llama",
                a.cache.c_str(), a.threads, L, L / prefill, 100 * prefill_attn / prefill,
                steps / decode, 100 * decode_attn / decode);
    std::fflush(stdout);
  }
}

template <class T>
void run(const Args& a, const model::Config& c, const model::Weights& w,
         const model::Vocab& vocab) {
  if (!a.bench.empty())
    bench<T>(a, c, w);
  else
    generate<T>(a, c, w, vocab);
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  if (a.ids.empty() && a.bench.empty()) throw std::runtime_error("model_runner: --ids is empty");
  const model::GgufFile file(a.model);
  model::Config c = model::read_config(file);
  if (a.window >= 0) c.window = a.window;
  if (!a.pairing.empty())
    c.pairing = a.pairing == "gptj" ? attnkit::RopePairing::GptJ : attnkit::RopePairing::NeoX;
  const model::Weights w = model::load_weights(file, c);
  const model::Vocab vocab(file);
  for (int id : a.ids)
    if (id < 0 || id >= c.vocab)
      throw std::runtime_error("model_runner: a token id is out of range");
  if (a.cache == "f32")
    run<float>(a, c, w, vocab);
  else if (a.cache == "bf16")
    run<Eigen::bfloat16>(a, c, w, vocab);
  else if (a.cache == "q8_0")
    run<attnkit::BlockQ8_0>(a, c, w, vocab);
  else
    throw std::runtime_error("model_runner: --cache is f32, bf16 or q8_0, not " + a.cache);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
