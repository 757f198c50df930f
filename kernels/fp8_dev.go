//go:build manifold_dev

package kernels

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
)

// The FP8 GEMM candidate on Hopper's FP8 tensor cores (fp8.cuh, dev image
// only: fp8_act_quant, gemm_fp8q_t64), measured against the default
// gemm_fp8_t* (e4m3 widened to fp16 in registers) by BenchmarkFP8TensorCores.
// It quantizes x to E4M3 per token and 128-element block, so its results
// differ from the reference by about 2^-4 of each x block's largest value.

// fp8qScratch is the quantized x and its scales, grown as needed.
type fp8qScratch struct {
	xq, sx       *allocation
	xqLen, sxLen int
}

// matmulFP8Q queues dst[m, N] = x[m, K]·wᵀ (+ bias) for an FP8 weight on
// the FP8 tensor cores: x 16-byte aligned, K % 16 == 0.
func (b *Backend) matmulFP8Q(dst, x *Buffer, w *Weight, m int) error {
	if w.format != backend.FP8Block || x.ptr%16 != 0 || w.cols%16 != 0 {
		return fmt.Errorf("kernels: gemm_fp8q takes FP8 weights with K %% 16 == 0 and aligned x")
	}
	N, K := w.rows, w.cols
	mpad, kt := (m+63)/64*64, (K+fp8Tile-1)/fp8Tile
	s := &b.exp.fp8q
	if err := b.grow(&s.xq, &s.xqLen, mpad*K/4); err != nil {
		return err
	}
	if err := b.grow(&s.sx, &s.sxLen, mpad*kt); err != nil {
		return err
	}
	bias := uint64(0)
	if w.bias != nil {
		bias = w.bias.ptr
	}
	b.launch("fp8_act_quant", [3]int{min((mpad*kt+7)/8, 8*b.sms), 1, 1}, 256, 0, s.xq.ptr, s.sx.ptr, x.ptr, m, mpad, K)
	b.launch("gemm_fp8q_t64", [3]int{(N + 127) / 128, mpad / 64, 1}, 256, 3*(128+64)*160,
		w.data.ptr, w.scales.ptr, s.xq.ptr, s.sx.ptr, dst.ptr, bias, N, K, m)
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, w, x, dst, s.xq, s.sx)
	b.qmu.Unlock()
	return nil
}
