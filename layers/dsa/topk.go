package dsa

import "github.com/manifoldlm/manifold/layers"

// TopKScratch is layers.TopKScratch: TopK's reusable working memory.
type TopKScratch = layers.TopKScratch

// TopK is layers.TopK: the indices of the k largest values of row, in
// torch.topk's CPU order with its tie-breaking.
func TopK(dst []int32, row []float32, k int, sorted bool, scratch *TopKScratch) {
	layers.TopK(dst, row, k, sorted, scratch)
}
