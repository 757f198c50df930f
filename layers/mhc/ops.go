package mhc

// HeadActivate is the reference of backend.HyperConnectionOps.MHCHeadActivate: hc_head logits [rows, n] into
// collapse weights in place, sigmoid(logit * scale + base[i]) + eps.
func HeadActivate(pre, base []float32, scale, eps float32, rows, n int) {
	for i, v := range pre[:rows*n] {
		pre[i] = Sigmoid(v*scale+base[i%n]) + eps
	}
}
