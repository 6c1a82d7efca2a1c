// Maps and sets keyed by DeferredStorage pointers for the passes of one flush
// (liveness, partition, structural keys, flush-local memory).
//
// Open addressing with linear probing in two flat arrays: an insert does not
// allocate, unlike std::unordered_map's one node per entry. Those allocations
// and frees were about half of partition()'s time and a third of a small
// flush's (perf, a 16-op chain on 4x4 tensors: 19 us per flush).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "lazy/deferred_storage.h"

namespace tpu_eager {

template <typename V>
class StorageMap {
 public:
  // Room for `expected` entries before the first growth.
  explicit StorageMap(size_t expected = 8) { rehash(capacity_for(expected)); }

  // The value of `s`, or nullptr when absent.
  V* find(const DeferredStorage* s) {
    for (size_t i = slot(s);; i = (i + 1) & mask_) {
      if (keys_[i] == s) return &values_[i];
      if (keys_[i] == nullptr) return nullptr;
    }
  }
  const V* find(const DeferredStorage* s) const { return const_cast<StorageMap*>(this)->find(s); }
  bool contains(const DeferredStorage* s) const { return find(s) != nullptr; }

  // The value of `s`, inserted as `init` when absent.
  V& get_or(const DeferredStorage* s, const V& init) {
    if (2 * (size_ + 1) > keys_.size()) rehash(2 * keys_.size());
    size_t i = slot(s);
    for (; keys_[i] != nullptr; i = (i + 1) & mask_)
      if (keys_[i] == s) return values_[i];
    keys_[i] = s;
    values_[i] = init;
    ++size_;
    return values_[i];
  }
  V& operator[](const DeferredStorage* s) { return get_or(s, V{}); }

  // Removes `s` and destroys its value now; false when absent. Backward-shift
  // deletion: entries after it in its probe run move up into the hole, so
  // lookups need no tombstones.
  bool erase(const DeferredStorage* s) {
    size_t hole = slot(s);
    for (;; hole = (hole + 1) & mask_) {
      if (keys_[hole] == nullptr) return false;
      if (keys_[hole] == s) break;
    }
    for (size_t j = (hole + 1) & mask_; keys_[j] != nullptr; j = (j + 1) & mask_) {
      // The entry at j stays when its home slot lies cyclically in (hole, j].
      const size_t home = slot(keys_[j]);
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      keys_[hole] = keys_[j];
      values_[hole] = std::move(values_[j]);
      hole = j;
    }
    keys_[hole] = nullptr;
    values_[hole] = V{};
    --size_;
    return true;
  }

  size_t size() const { return size_; }

  // Removes every entry, destroying the values now, and keeps the room for
  // the next use (a flush's maps are reused by the thread's next flush:
  // growing them again by rehash every flush cost ~1 K instructions). A map
  // more than four times the room `expected` entries need shrinks to it.
  void clear(size_t expected = 8) {
    const size_t want = capacity_for(expected);
    if (keys_.size() > 4 * want) {
      std::vector<const DeferredStorage*>(want, nullptr).swap(keys_);
      std::vector<V>(want).swap(values_);
      mask_ = want - 1;
      size_ = 0;
      return;
    }
    for (size_t i = 0; size_ > 0 && i < keys_.size(); ++i) {
      if (keys_[i] == nullptr) continue;
      keys_[i] = nullptr;
      values_[i] = V{};
      --size_;
    }
  }

  // Calls f(storage, value) for every entry, in no particular order.
  template <typename F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] != nullptr) f(keys_[i], values_[i]);
  }

 private:
  static size_t capacity_for(size_t expected) {
    size_t c = 16;
    while (c < 2 * expected) c *= 2;
    return c;
  }
  // Storages are heap objects at least 16 bytes apart: drop the low bits,
  // then spread with a multiplicative (Fibonacci) hash.
  size_t slot(const DeferredStorage* s) const {
    const uint64_t h = (reinterpret_cast<uintptr_t>(s) >> 4) * 0x9E3779B97F4A7C15ULL;
    return static_cast<size_t>(h >> 32) & mask_;
  }
  void rehash(size_t capacity) {
    std::vector<const DeferredStorage*> keys(capacity, nullptr);
    std::vector<V> values(capacity);
    keys.swap(keys_);
    values.swap(values_);
    mask_ = capacity - 1;
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != nullptr) get_or(keys[i], values[i]);
  }

  std::vector<const DeferredStorage*> keys_;
  std::vector<V> values_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

// A set of storages: a StorageMap whose values are unused.
class StorageSet {
 public:
  explicit StorageSet(size_t expected = 8) : map_(expected) {}
  // True when `s` was not yet in the set.
  bool insert(const DeferredStorage* s) {
    const size_t before = map_.size();
    map_.get_or(s, 1);
    return map_.size() != before;
  }
  bool contains(const DeferredStorage* s) const { return map_.contains(s); }
  size_t size() const { return map_.size(); }
  // Empties the set, keeping its room (StorageMap::clear).
  void clear(size_t expected = 8) { map_.clear(expected); }
  template <typename F>
  void for_each(F&& f) const {
    map_.for_each([&](const DeferredStorage* s, char) { f(s); });
  }

 private:
  StorageMap<char> map_;
};

}  // namespace tpu_eager
