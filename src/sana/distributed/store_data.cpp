#include "sana/distributed/store_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace sana::dist {

using namespace store_wire;

namespace {

using Outcome = StoreData::Outcome;

Outcome reply(Bytes frame, bool changed = false) {
  Outcome o;
  o.kind = Outcome::Kind::reply;
  o.frame = std::move(frame);
  o.changed = changed;
  return o;
}

Outcome malformed() { return {}; }

FrameWriter ok() { return FrameWriter(static_cast<uint8_t>(Status::ok)); }

}  // namespace

StoreData::StoreData(std::function<int64_t()> now_ms) : now_ms_(std::move(now_ms)) {}

int64_t StoreData::steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void StoreData::write(const std::string& key, Bytes value) {
  data_[key] = std::move(value);
  written_ms_[key] = now_ms_();
}

bool StoreData::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
}

Bytes StoreData::answer(Op op, const std::vector<std::string>& keys) const {
  if (op == Op::get) return ok().field(data_.at(keys.front())).take();
  return ok().take();
}

Outcome StoreData::apply(const uint8_t* body, size_t size) {
  FrameReader r(body, size);
  const auto op_byte = r.head();
  if (!op_byte) return malformed();
  switch (static_cast<Op>(*op_byte)) {
    case Op::hello:
      return reply(ok().take());
    case Op::set: {
      auto key = r.text();
      auto value = r.bytes();
      if (!key || !value || !r.done()) return malformed();
      write(*key, std::move(*value));
      return reply(ok().take(), true);
    }
    case Op::get:
    case Op::wait:
      return wait_or_get(static_cast<Op>(*op_byte), r);
    case Op::add:
      return add(r);
    case Op::check: {
      std::vector<std::string> keys;
      while (!r.done()) {
        auto key = r.text();
        if (!key) return malformed();
        keys.push_back(std::move(*key));
      }
      return reply(ok().integer(has_all(keys) ? 1 : 0).take());
    }
    case Op::compare_set:
      return compare_set(r);
    case Op::erase: {
      auto key = r.text();
      if (!key || !r.done()) return malformed();
      written_ms_.erase(*key);
      return reply(ok().integer(data_.erase(*key) > 0 ? 1 : 0).take());
    }
    case Op::age: {
      auto key = r.text();
      if (!key || !r.done()) return malformed();
      const auto it = written_ms_.find(*key);
      return reply(ok().integer(it == written_ms_.end() ? -1 : std::max<int64_t>(0, now_ms_() - it->second)).take());
    }
    case Op::num_keys:
      if (!r.done()) return malformed();
      return reply(ok().integer(static_cast<int64_t>(data_.size())).take());
  }
  return malformed();
}

Outcome StoreData::wait_or_get(Op op, FrameReader& r) {
  Outcome o;
  o.op = op;
  std::optional<int64_t> timeout_ms;
  if (op == Op::get) {
    auto key = r.text();
    timeout_ms = r.integer();
    if (!key || !timeout_ms || !r.done()) return malformed();
    o.keys.push_back(std::move(*key));
  } else {
    timeout_ms = r.integer();
    if (!timeout_ms) return malformed();
    while (!r.done()) {
      auto key = r.text();
      if (!key) return malformed();
      o.keys.push_back(std::move(*key));
    }
  }
  if (has_all(o.keys)) return reply(answer(op, o.keys));
  if (*timeout_ms <= 0) return reply(FrameWriter(static_cast<uint8_t>(Status::timeout)).take());
  o.kind = Outcome::Kind::park;
  o.timeout_ms = std::min<int64_t>(*timeout_ms, int64_t{1} << 40);
  return o;
}

Outcome StoreData::add(FrameReader& r) {
  auto key = r.text();
  auto delta = r.integer();
  if (!key || !delta || !r.done()) return malformed();
  int64_t now = *delta;
  auto it = data_.find(*key);
  if (it != data_.end()) {
    const auto held = parse_counter(it->second);
    if (!held) {
      return reply(FrameWriter(static_cast<uint8_t>(Status::error))
                       .field(fmt::format("key '{}' does not hold an integer", *key))
                       .take());
    }
    // Wraps like the int64 it is, instead of overflowing.
    now = static_cast<int64_t>(static_cast<uint64_t>(now) + static_cast<uint64_t>(*held));
  }
  const std::string text = counter_text(now);
  write(*key, Bytes(text.begin(), text.end()));
  return reply(ok().integer(now).take(), true);
}

Outcome StoreData::compare_set(FrameReader& r) {
  auto key = r.text();
  auto expected = r.bytes();
  auto desired = r.bytes();
  if (!key || !expected || !desired || !r.done()) return malformed();
  auto it = data_.find(*key);
  Bytes held;
  bool changed = false;
  if (it == data_.end()) {
    if (expected->empty()) {
      write(*key, *desired);
      held = std::move(*desired);
      changed = true;
    } else {
      held = std::move(*expected);
    }
  } else if (it->second == *expected) {
    write(*key, *desired);
    held = std::move(*desired);
    changed = true;
  } else {
    held = it->second;
  }
  return reply(ok().field(held).take(), changed);
}

}  // namespace sana::dist
