// gen_topk.cc writes topk_libstdcxx.txt: torch.topk's CPU algorithm
// (aten/src/ATen/native/TopKImpl.h, PyTorch >= 2.9) run with libstdc++ on
// rows with many ties, for TestTopKMatchesLibstdcxx.
//
//   g++ -O1 -std=c++17 -o /tmp/gen_topk gen_topk.cc && /tmp/gen_topk > topk_libstdcxx.txt
//
// Each line: n k sorted palette-digits... : indices...
// Palette: 0=NaN 1=-inf 2=-2 3=-1 4=0 5=0.25 6=1 7=3 8=+inf
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

using elem_t = std::pair<float, int64_t>;

static bool comp(const elem_t& x, const elem_t& y) {
  return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
}

static std::vector<int64_t> topk(const std::vector<float>& v, int64_t k, bool sorted) {
  int64_t n = v.size();
  bool use_partial_sort = k * 64 <= n;
  std::vector<elem_t> queue(use_partial_sort ? k : n);
  for (int64_t j = 0; j < (use_partial_sort ? k : n); j++) queue[j] = {v[j], j};
  if (use_partial_sort) {
    auto b = queue.begin(), e = queue.begin() + k;
    std::make_heap(b, e, comp);
    for (int64_t idx = k; idx < n; ++idx) {
      elem_t this_val{v[idx], idx};
      if (comp(this_val, queue.front())) {
        std::pop_heap(b, e, comp);
        queue.back() = this_val;
        std::push_heap(b, e, comp);
      }
    }
    if (sorted) std::sort_heap(b, e, comp);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), comp);
    if (sorted) std::sort(queue.begin(), queue.begin() + k - 1, comp);
  }
  std::vector<int64_t> out(k);
  for (int64_t j = 0; j < k; j++) out[j] = queue[j].second;
  return out;
}

int main() {
  const float inf = std::numeric_limits<float>::infinity();
  const float palette[9] = {std::nanf(""), -inf, -2, -1, 0, 0.25f, 1, 3, inf};
  std::mt19937 rng(7);
  const int sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 33, 64, 65, 96, 128, 129, 200, 257, 320};
  for (int n : sizes) {
    for (int rep = 0; rep < 6; rep++) {
      // palette width: few distinct values -> many ties; NaN only sometimes
      int lo = (rep % 3 == 0) ? 0 : 1;
      int hi = 2 + rep;
      std::uniform_int_distribution<int> d(lo, std::min(hi, 8));
      std::vector<int> digits(n);
      std::vector<float> v(n);
      for (int i = 0; i < n; i++) { digits[i] = d(rng); v[i] = palette[digits[i]]; }
      std::vector<int> ks = {1, 2, 3, n / 2, n - 1, n, n / 64, n / 65 + 1};
      for (int k : ks) {
        if (k < 1 || k > n) continue;
        for (int sorted = 0; sorted < 2; sorted++) {
          auto idx = topk(v, k, sorted);
          printf("%d %d %d ", n, k, sorted);
          for (int x : digits) printf("%d", x);
          printf(" :");
          for (auto i : idx) printf(" %lld", (long long)i);
          printf("\n");
        }
      }
    }
  }
}
