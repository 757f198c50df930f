package dsa

import "fmt"

// KeyCache holds the indexer keys of one attention layer of one sequence:
// one HeadDim-vector per position, after LayerNorm and RoPE, so decoding
// scores new queries against every earlier position without recomputing
// them. The zero value is not usable: call NewKeyCache.
type KeyCache struct {
	dim  int
	keys []float32 // len = positions*dim; cap = capacity*dim
}

// NewKeyCache returns an empty cache of dim-channel keys with room for
// capacity positions before it grows.
func NewKeyCache(dim, capacity int) (*KeyCache, error) {
	if dim <= 0 || capacity < 0 {
		return nil, fmt.Errorf("dsa: key cache dim %d capacity %d, want dim > 0 and capacity >= 0", dim, capacity)
	}
	return &KeyCache{dim: dim, keys: make([]float32, 0, dim*capacity)}, nil
}

// Append adds the keys of len(k)/dim new positions.
func (c *KeyCache) Append(k []float32) error {
	if len(k)%c.dim != 0 {
		return fmt.Errorf("dsa: key cache append of %d values, not a multiple of dim %d", len(k), c.dim)
	}
	c.keys = append(c.keys, k...)
	return nil
}

// Keys is the cached keys, [Len, dim]. The slice is valid until the next
// Append or Truncate.
func (c *KeyCache) Keys() []float32 { return c.keys }

// Len is the number of positions cached.
func (c *KeyCache) Len() int { return len(c.keys) / c.dim }

// Dim is the number of channels of a key.
func (c *KeyCache) Dim() int { return c.dim }

// Truncate drops every position from n on.
func (c *KeyCache) Truncate(n int) {
	if n < c.Len() {
		c.keys = c.keys[:max(n, 0)*c.dim]
	}
}

// BytesPerToken is the memory one cached position takes: dim float32 values.
func (c *KeyCache) BytesPerToken() int { return 4 * c.dim }

// Bytes is the memory the cache holds (its capacity).
func (c *KeyCache) Bytes() int64 { return int64(cap(c.keys)) * 4 }
