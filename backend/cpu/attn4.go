package cpu

import "math"

// Grouped-query attention on the CPU: the query heads that share a KV head
// are taken 4 at a time, so that one pass over the KV head's keys and one
// over its values serve the 4 (scores4, values4), with a float32 exp.

// attend4 writes to o (4*hd) the attention of the 4 query rows q (4*hd)
// over the n key and value rows at keys and values (stride floats apart):
// softmax(scale * q·k) weighted sums of the values. sc is scratch of 4*n.
func attend4(o, q, keys, values []float32, stride, n, hd int, scale float32, sc []float32) {
	var mx, sum [4]float32
	attend4Part(o, q, keys, values, stride, n, hd, scale, sc, &mx, &sum)
	for g := range 4 {
		inv := 1 / sum[g]
		for j := range o[g*hd : (g+1)*hd] {
			o[g*hd+j] *= inv
		}
	}
}

// attend4Part is attend4 before the division by the weights' sums: o[g] is
// Σ_t e^(s[g,t] - mx[g]) v[t] with mx[g] the largest score s[g,t], sum[g]
// Σ_t e^(s[g,t] - mx[g]). Parts over consecutive runs of the keys merge
// into the whole (mergeParts4).
func attend4Part(o, q, keys, values []float32, stride, n, hd int, scale float32, sc []float32, mx, sum *[4]float32) {
	sc = sc[:4*n]
	scores4(q, keys, stride, n, hd, scale, sc)
	*sum = [4]float32{}
	for g := range mx {
		mx[g] = float32(math.Inf(-1))
	}
	n4 := max4Fast(sc, n, mx) // the first n4 rows in assembly where there is
	for t := n4; t < n; t++ {
		for g := range 4 {
			mx[g] = max(mx[g], sc[4*t+g])
		}
	}
	exp4Fast(sc, n4, mx, sum)
	for t := n4; t < n; t++ {
		for g := range 4 {
			e := expf32(sc[4*t+g] - mx[g])
			sc[4*t+g] = e
			sum[g] += e
		}
	}
	values4(o, sc, values, stride, n, hd)
}

// partLen is the floats of one attend4Part result in a run of parts: its
// 4*hd outputs, then its 4 maxima and 4 sums.
func partLen(hd int) int { return 4*hd + 8 }

// mergeParts4 writes to o (4*hd) the attention that the parts (each
// partLen(hd) floats, from attend4Part over consecutive runs of the keys;
// a run without keys has sum 0) make together: each part's outputs and sum
// are rescaled from its maxima to the largest, summed, and divided.
func mergeParts4(o, parts []float32, hd int) {
	n := len(parts) / partLen(hd)
	for g := range 4 {
		mx := float32(math.Inf(-1))
		for c := range n {
			part := parts[c*partLen(hd):]
			if part[4*hd+4+g] > 0 {
				mx = max(mx, part[4*hd+g])
			}
		}
		og := o[g*hd : (g+1)*hd]
		clear(og)
		var sum float32
		for c := range n {
			part := parts[c*partLen(hd):]
			if s := part[4*hd+4+g]; s > 0 {
				w := expf32(part[4*hd+g] - mx)
				sum += w * s
				axpyF32(og, part[g*hd:(g+1)*hd], w)
			}
		}
		inv := 1 / sum
		for j := range og {
			og[j] *= inv
		}
	}
}

// scores4Go is the portable scores4: out[4t+g] = scale * q[g]·k[t].
func scores4Go(q, k []float32, stride, n, hd int, scale float32, out []float32) {
	for t := range n {
		for g := range 4 {
			out[4*t+g] = dotF32Go(q[g*hd:(g+1)*hd], k[t*stride:t*stride+hd]) * scale
		}
	}
}

// values4Go is the portable values4: acc[g] = Σ_t w[4t+g] * v[t].
func values4Go(acc, w, v []float32, stride, n, hd int) {
	clear(acc[:4*hd])
	for t := range n {
		for g := range 4 {
			axpyF32Go(acc[g*hd:(g+1)*hd], v[t*stride:t*stride+hd], w[4*t+g])
		}
	}
}

// expf32 is e^x in float32 (within 2 ulp of math.Exp's rounding for x in
// the softmax's range, x <= 0): x = n*ln2 + r, |r| <= ln2/2, a degree-7
// Taylor polynomial of e^r times 2^n built from its bits.
func expf32(x float32) float32 {
	switch {
	case x < -87.33654: // e^x below the smallest normal float32
		return 0
	case x > 88.72:
		return float32(math.Inf(1))
	case x != x:
		return x
	}
	const log2e, ln2hi, ln2lo = 1.44269504, 0.693145751953125, 1.428606765330187e-06
	kf := x * log2e
	if kf >= 0 {
		kf += 0.5
	} else {
		kf -= 0.5
	}
	n := int32(kf)
	nf := float32(n)
	r := x - nf*ln2hi - nf*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	return p * math.Float32frombits(uint32(n+127)<<23)
}
