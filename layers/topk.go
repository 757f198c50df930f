package layers

import "math"

// TopK writes into dst the indices of the k largest values of row, in the
// order torch.topk(row, k, largest=True, sorted=sorted) returns them on the
// CPU, ties included.
//
// PyTorch's CPU kernel (aten/src/ATen/native/TopKImpl.h, 2.9 and later) is
// reproduced step by step because which of several equal values is selected
// depends on the algorithm, not on a documented rule:
//
//   - when k*64 <= len(row), a k-entry binary heap is built from the first k
//     values (std::make_heap) and every later value strictly greater than the
//     heap's smallest replaces it (std::pop_heap, then std::push_heap); with
//     sorted, std::sort_heap orders the result;
//   - otherwise std::nth_element (libstdc++ introselect) partitions the row
//     around position k-1 and, with sorted, std::sort orders the first k-1.
//
// The comparator treats NaN as larger than every number, as torch does.
// Ties are therefore broken exactly as the reference does: the indexer's top-k
// over rows whose masked entries are all -inf, and MoE routing, select the same
// sets. The libstdc++ algorithms are ported from GCC 12's bits/stl_algo.h and
// bits/stl_heap.h and checked against them in topk_test.go.
//
// dst must have room for k indices; scratch (may be nil) is reused when it is
// large enough. TopK panics if k > len(row) or k < 0 (a programming error).
func TopK(dst []int32, row []float32, k int, sorted bool, scratch *TopKScratch) {
	n := len(row)
	if k < 0 || k > n {
		panic("layers.TopK: k out of range")
	}
	if k == 0 {
		return
	}
	var s TopKScratch
	if scratch == nil {
		scratch = &s
	}
	if k*64 <= n {
		q := scratch.get(k)
		for j := range k {
			q[j] = topkEntry{row[j], int32(j)}
		}
		makeHeap(q)
		for idx := k; idx < n; idx++ {
			v := topkEntry{row[idx], int32(idx)}
			if topkLess(v, q[0]) {
				// std::pop_heap moves the top to the back (a no-op for
				// k == 1); the back is overwritten and std::push_heap
				// sifts it up.
				if k > 1 {
					popHeap(q, k-1, k-1)
				}
				q[k-1] = v
				pushHeap(q, k-1, 0, v)
			}
		}
		if sorted {
			sortHeap(q)
		}
		for j := range k {
			dst[j] = q[j].i
		}
		return
	}
	q := scratch.get(n)
	for j, v := range row {
		q[j] = topkEntry{v, int32(j)}
	}
	introselect(q, 0, k-1, n, 2*lg(n))
	if sorted {
		introsort(q[:k-1])
	}
	for j := range k {
		dst[j] = q[j].i
	}
}

// TopKScratch holds TopK's working memory so repeated calls do not allocate.
// The zero value is ready to use; it is not safe for concurrent use.
type TopKScratch struct {
	q []topkEntry
}

func (s *TopKScratch) get(n int) []topkEntry {
	if cap(s.q) < n {
		s.q = make([]topkEntry, n)
	}
	return s.q[:n]
}

type topkEntry struct {
	v float32
	i int32
}

// topkLess is torch's comparator for largest=True: "a goes before b".
func topkLess(a, b topkEntry) bool {
	an := math.IsNaN(float64(a.v))
	bn := math.IsNaN(float64(b.v))
	return (an && !bn) || a.v > b.v
}

// lg is std::__lg: floor(log2(n)) for n > 0.
func lg(n int) int {
	r := -1
	for n > 0 {
		n >>= 1
		r++
	}
	return r
}

// --- bits/stl_heap.h ---

// pushHeap is std::__push_heap(first, hole, top, value).
func pushHeap(q []topkEntry, hole, top int, v topkEntry) {
	parent := (hole - 1) / 2
	for hole > top && topkLess(q[parent], v) {
		q[hole] = q[parent]
		hole = parent
		parent = (hole - 1) / 2
	}
	q[hole] = v
}

// adjustHeap is std::__adjust_heap(first, hole, len, value).
func adjustHeap(q []topkEntry, hole, n int, v topkEntry) {
	top := hole
	second := hole
	for second < (n-1)/2 {
		second = 2 * (second + 1)
		if topkLess(q[second], q[second-1]) {
			second--
		}
		q[hole] = q[second]
		hole = second
	}
	if n&1 == 0 && second == (n-2)/2 {
		second = 2 * (second + 1)
		q[hole] = q[second-1]
		hole = second - 1
	}
	pushHeap(q, hole, top, v)
}

// popHeap is std::__pop_heap(first, first+n, first+result): the heap is
// q[:n] and q[result] receives its top.
func popHeap(q []topkEntry, n, result int) {
	v := q[result]
	q[result] = q[0]
	adjustHeap(q, 0, n, v)
}

// makeHeap is std::__make_heap.
func makeHeap(q []topkEntry) {
	n := len(q)
	if n < 2 {
		return
	}
	for parent := (n - 2) / 2; ; parent-- {
		adjustHeap(q, parent, n, q[parent])
		if parent == 0 {
			return
		}
	}
}

// sortHeap is std::__sort_heap.
func sortHeap(q []topkEntry) {
	for last := len(q); last > 1; {
		last--
		popHeap(q, last, last)
	}
}

// heapSelect is std::__heap_select(first, middle, last) on q[first:last].
func heapSelect(q []topkEntry, first, middle, last int) {
	h := q[first:last]
	n := middle - first
	makeHeap(h[:n])
	for i := n; i < len(h); i++ {
		if topkLess(h[i], h[0]) {
			popHeap(h, n, i)
		}
	}
}

// --- bits/stl_algo.h ---

// moveMedianToFirst is std::__move_median_to_first(result, a, b, c).
func moveMedianToFirst(q []topkEntry, result, a, b, c int) {
	switch {
	case topkLess(q[a], q[b]):
		switch {
		case topkLess(q[b], q[c]):
			q[result], q[b] = q[b], q[result]
		case topkLess(q[a], q[c]):
			q[result], q[c] = q[c], q[result]
		default:
			q[result], q[a] = q[a], q[result]
		}
	case topkLess(q[a], q[c]):
		q[result], q[a] = q[a], q[result]
	case topkLess(q[b], q[c]):
		q[result], q[c] = q[c], q[result]
	default:
		q[result], q[b] = q[b], q[result]
	}
}

// unguardedPartition is std::__unguarded_partition(first, last, pivot).
func unguardedPartition(q []topkEntry, first, last, pivot int) int {
	for {
		for topkLess(q[first], q[pivot]) {
			first++
		}
		last--
		for topkLess(q[pivot], q[last]) {
			last--
		}
		if first >= last {
			return first
		}
		q[first], q[last] = q[last], q[first]
		first++
	}
}

// unguardedPartitionPivot is std::__unguarded_partition_pivot.
func unguardedPartitionPivot(q []topkEntry, first, last int) int {
	mid := first + (last-first)/2
	moveMedianToFirst(q, first, first+1, mid, last-1)
	return unguardedPartition(q, first+1, last, first)
}

// unguardedLinearInsert is std::__unguarded_linear_insert(last).
func unguardedLinearInsert(q []topkEntry, last int) {
	v := q[last]
	next := last - 1
	for topkLess(v, q[next]) {
		q[last] = q[next]
		last = next
		next--
	}
	q[last] = v
}

// insertionSort is std::__insertion_sort(first, last).
func insertionSort(q []topkEntry, first, last int) {
	if first == last {
		return
	}
	for i := first + 1; i != last; i++ {
		if topkLess(q[i], q[first]) {
			v := q[i]
			copy(q[first+1:i+1], q[first:i])
			q[first] = v
		} else {
			unguardedLinearInsert(q, i)
		}
	}
}

// introselect is std::__introselect(first, nth, last, depth).
func introselect(q []topkEntry, first, nth, last, depth int) {
	for last-first > 3 {
		if depth == 0 {
			heapSelect(q, first, nth+1, last)
			q[first], q[nth] = q[nth], q[first]
			return
		}
		depth--
		cut := unguardedPartitionPivot(q, first, last)
		if cut <= nth {
			first = cut
		} else {
			last = cut
		}
	}
	insertionSort(q, first, last)
}

const sortThreshold = 16 // libstdc++ _S_threshold

// introsort is std::sort (std::__sort) on the whole of q.
func introsort(q []topkEntry) {
	n := len(q)
	if n == 0 {
		return
	}
	introsortLoop(q, 0, n, 2*lg(n))
	// std::__final_insertion_sort
	if n > sortThreshold {
		insertionSort(q, 0, sortThreshold)
		for i := sortThreshold; i != n; i++ {
			unguardedLinearInsert(q, i)
		}
	} else {
		insertionSort(q, 0, n)
	}
}

// introsortLoop is std::__introsort_loop(first, last, depth).
func introsortLoop(q []topkEntry, first, last, depth int) {
	for last-first > sortThreshold {
		if depth == 0 {
			// std::__partial_sort(first, last, last)
			heapSelect(q, first, last, last)
			sortHeap(q[first:last])
			return
		}
		depth--
		cut := unguardedPartitionPivot(q, first, last)
		introsortLoop(q, cut, last, depth)
		last = cut
	}
}
