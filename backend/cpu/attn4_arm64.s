#include "textflag.h"
#include "neon_arm64.h"

// The NEON attention kernels (attn4.go): scores4Kernel and values4Kernel, and
// the DSA/htree inner loops axpyF32NEON and ropeDotNEON. Instructions Go's
// assembler has no mnemonic for are WORDs with their GNU syntax in a
// comment (dev/arm64/words.sh checks them).

// func scores4Kernel(q, k *float32, stride, n, hd int, scale float32, out *float32)
// out[4t+g] = scale * Σ_j q[g*hd+j]·k[t*stride+j] for the 4 query rows q
// (hd floats each, hd%8 == 0) and the n key rows k (stride floats apart):
// 8 columns a step, two accumulators a query (V16..V23).
TEXT ·scores4Kernel(SB), NOSPLIT, $0-56
	MOVD  q+0(FP), R0
	MOVD  k+8(FP), R1
	MOVD  stride+16(FP), R2
	LSL   $2, R2, R2
	MOVD  n+24(FP), R3
	MOVD  hd+32(FP), R4
	LSL   $2, R4, R4
	FMOVS scale+40(FP), F30
	MOVD  out+48(FP), R5
	ADD   R4, R0, R6
	ADD   R4, R6, R7
	ADD   R4, R7, R8

s4key:
	CBZ  R3, s4done
	ZERO4(V16, V17, V18, V19)
	ZERO4(V20, V21, V22, V23)
	MOVD R1, R9
	MOVD R0, R10
	MOVD R6, R11
	MOVD R7, R12
	MOVD R8, R13
	MOVD R4, R14

s4col:
	VLD1.P 32(R9), [V0.S4, V1.S4]
	VLD1.P 32(R10), [V2.S4, V3.S4]
	VLD1.P 32(R11), [V4.S4, V5.S4]
	VLD1.P 32(R12), [V6.S4, V7.S4]
	VLD1.P 32(R13), [V8.S4, V9.S4]
	VFMLA V0.S4, V2.S4, V16.S4
	VFMLA V1.S4, V3.S4, V17.S4
	VFMLA V0.S4, V4.S4, V18.S4
	VFMLA V1.S4, V5.S4, V19.S4
	VFMLA V0.S4, V6.S4, V20.S4
	VFMLA V1.S4, V7.S4, V21.S4
	VFMLA V0.S4, V8.S4, V22.S4
	VFMLA V1.S4, V9.S4, V23.S4
	SUBS $32, R14, R14
	BNE  s4col

	SUM4ROWS
	WORD $0x4f9e9210 /* fmul v16.4s, v16.4s, v30.s[0] */
	VST1.P [V16.S4], 16(R5)
	ADD  R2, R1, R1
	SUB  $1, R3, R3
	B    s4key

s4done:
	RET

// func values4Kernel(acc, w, v *float32, stride, n, hd int)
// acc[g*hd+j] = Σ_t w[4t+g]·v[t*stride+j] for the 4 rows g (hd%16 == 0),
// 16 columns at a time over all n value rows: 16 accumulators (V16..V31,
// row g in V16+4g..V19+4g), FMLA by element of the row's 4 weights.
TEXT ·values4Kernel(SB), NOSPLIT, $0-48
	MOVD acc+0(FP), R0
	MOVD w+8(FP), R1
	MOVD v+16(FP), R2
	MOVD stride+24(FP), R3
	LSL  $2, R3, R3
	MOVD n+32(FP), R4
	MOVD hd+40(FP), R5
	LSL  $2, R5, R5
	MOVD $0, R6

v4chunk:
	CMP  R5, R6
	BGE  v4done
	ZERO4(V16, V17, V18, V19)
	ZERO4(V20, V21, V22, V23)
	ZERO4(V24, V25, V26, V27)
	ZERO4(V28, V29, V30, V31)
	MOVD R1, R7
	ADD  R6, R2, R8
	MOVD R4, R9

v4row:
	CBZ  R9, v4store
	VLD1 (R8), [V0.S4, V1.S4, V2.S4, V3.S4]
	ADD  R3, R8, R8
	VLD1.P 16(R7), [V4.S4]
	WORD $0x4f841010 /* fmla v16.4s, v0.4s, v4.s[0] */
	WORD $0x4f841031 /* fmla v17.4s, v1.4s, v4.s[0] */
	WORD $0x4f841052 /* fmla v18.4s, v2.4s, v4.s[0] */
	WORD $0x4f841073 /* fmla v19.4s, v3.4s, v4.s[0] */
	WORD $0x4fa41014 /* fmla v20.4s, v0.4s, v4.s[1] */
	WORD $0x4fa41035 /* fmla v21.4s, v1.4s, v4.s[1] */
	WORD $0x4fa41056 /* fmla v22.4s, v2.4s, v4.s[1] */
	WORD $0x4fa41077 /* fmla v23.4s, v3.4s, v4.s[1] */
	WORD $0x4f841818 /* fmla v24.4s, v0.4s, v4.s[2] */
	WORD $0x4f841839 /* fmla v25.4s, v1.4s, v4.s[2] */
	WORD $0x4f84185a /* fmla v26.4s, v2.4s, v4.s[2] */
	WORD $0x4f84187b /* fmla v27.4s, v3.4s, v4.s[2] */
	WORD $0x4fa4181c /* fmla v28.4s, v0.4s, v4.s[3] */
	WORD $0x4fa4183d /* fmla v29.4s, v1.4s, v4.s[3] */
	WORD $0x4fa4185e /* fmla v30.4s, v2.4s, v4.s[3] */
	WORD $0x4fa4187f /* fmla v31.4s, v3.4s, v4.s[3] */
	SUB  $1, R9, R9
	B    v4row

v4store:
	ADD  R6, R0, R10
	VST1 [V16.S4, V17.S4, V18.S4, V19.S4], (R10)
	ADD  R5, R10, R10
	VST1 [V20.S4, V21.S4, V22.S4, V23.S4], (R10)
	ADD  R5, R10, R10
	VST1 [V24.S4, V25.S4, V26.S4, V27.S4], (R10)
	ADD  R5, R10, R10
	VST1 [V28.S4, V29.S4, V30.S4, V31.S4], (R10)
	ADD  $64, R6, R6
	B    v4chunk

v4done:
	RET

// func axpyF32NEON(y, x *float32, a float32, n int)
// y[i] += a·x[i] for n a multiple of 4, 16 floats a step.
TEXT ·axpyF32NEON(SB), NOSPLIT, $0-32
	MOVD  y+0(FP), R0
	MOVD  x+8(FP), R1
	FMOVS a+16(FP), F30
	MOVD  n+24(FP), R2

axpy16:
	CMP  $16, R2
	BLT  axpy4
	VLD1.P 64(R1), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1 (R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	WORD $0x4f9e1004 /* fmla v4.4s, v0.4s, v30.s[0] */
	WORD $0x4f9e1025 /* fmla v5.4s, v1.4s, v30.s[0] */
	WORD $0x4f9e1046 /* fmla v6.4s, v2.4s, v30.s[0] */
	WORD $0x4f9e1067 /* fmla v7.4s, v3.4s, v30.s[0] */
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	SUB  $16, R2, R2
	B    axpy16

axpy4:
	CBZ  R2, axpydone
	VLD1.P 16(R1), [V0.S4]
	VLD1 (R0), [V4.S4]
	WORD $0x4f9e1004 /* fmla v4.4s, v0.4s, v30.s[0] */
	VST1.P [V4.S4], 16(R0)
	SUB  $4, R2, R2
	B    axpy4

axpydone:
	RET

// func ropeDotNEON(qa, qb, ka, kb, cos, sin *float32, n int) float32
// Σ cos[j]·(qa[j]·ka[j] + qb[j]·kb[j]) + sin[j]·(qb[j]·ka[j] − qa[j]·kb[j])
// for n a multiple of 4 (htree.RoPEDot), 4 pairs a step.
TEXT ·ropeDotNEON(SB), NOSPLIT, $0-60
	MOVD qa+0(FP), R0
	MOVD qb+8(FP), R1
	MOVD ka+16(FP), R2
	MOVD kb+24(FP), R3
	MOVD cos+32(FP), R4
	MOVD sin+40(FP), R5
	MOVD n+48(FP), R6
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16

rope4:
	CBZ  R6, ropedone
	VLD1.P 16(R0), [V0.S4]
	VLD1.P 16(R1), [V1.S4]
	VLD1.P 16(R2), [V2.S4]
	VLD1.P 16(R3), [V3.S4]
	VLD1.P 16(R4), [V4.S4]
	VLD1.P 16(R5), [V5.S4]
	WORD $0x6e22dc06 /* fmul v6.4s, v0.4s, v2.4s */
	VFMLA V3.S4, V1.S4, V6.S4
	WORD $0x6e22dc27 /* fmul v7.4s, v1.4s, v2.4s */
	VFMLS V3.S4, V0.S4, V7.S4
	VFMLA V6.S4, V4.S4, V16.S4
	VFMLA V7.S4, V5.S4, V17.S4
	SUB  $4, R6, R6
	B    rope4

ropedone:
	WORD $0x4e31d610 /* fadd v16.4s, v16.4s, v17.4s */
	WORD $0x6e30d610 /* faddp v16.4s, v16.4s, v16.4s */
	WORD $0x7e30da10 /* faddp s16, v16.2s */
	FMOVS F16, ret+56(FP)
	RET
