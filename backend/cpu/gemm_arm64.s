#include "textflag.h"

// The NEON 4x3 prefill tiles (gemm.go): 4 weight rows by 3 tokens, 12
// float32 accumulators of 4 lanes (V14..V25, pair (r, t) in V14+3r+t),
// 8 values of k a step: the tokens' x in V0..V5 (token t: V2t, V2t+1), the
// rows' weights in V6..V13 (row r: V6+2r, V7+2r). The result leaves each
// pair's 4 partial sums and 4 zeros in its 8 places of out.

// ZERO4(a, b, c, d) zeroes four vector registers.
#define ZERO4(a, b, c, d) \
	VEOR a.B16, a.B16, a.B16; \
	VEOR b.B16, b.B16, b.B16; \
	VEOR c.B16, c.B16, c.B16; \
	VEOR d.B16, d.B16, d.B16

// ARGS(size): R0..R3 the 4 weight rows (ldw elements of size bytes
// apart), R4..R6 the 3 tokens (ldx floats apart), R7 = k, accumulators and
// V31 zeroed.
#define ARGS(shift) \
	MOVD w+0(FP), R0; \
	MOVD ldw+8(FP), R9; \
	LSL  $shift, R9, R9; \
	ADD  R9, R0, R1; \
	ADD  R9, R1, R2; \
	ADD  R9, R2, R3; \
	MOVD x+16(FP), R4; \
	MOVD ldx+24(FP), R9; \
	LSL  $2, R9, R9; \
	ADD  R9, R4, R5; \
	ADD  R9, R5, R6; \
	MOVD k+32(FP), R7; \
	ZERO4(V14, V15, V16, V17); \
	ZERO4(V18, V19, V20, V21); \
	ZERO4(V22, V23, V24, V25); \
	VEOR V31.B16, V31.B16, V31.B16

#define LOADX \
	VLD1.P 32(R4), [V0.S4, V1.S4]; \
	VLD1.P 32(R5), [V2.S4, V3.S4]; \
	VLD1.P 32(R6), [V4.S4, V5.S4]

// ROW(lo, hi, a0, a1, a2): row weights lo (k 0..3), hi (4..7) into the
// accumulators a0..a2 of the 3 tokens.
#define ROW(lo, hi, a0, a1, a2) \
	VFMLA lo.S4, V0.S4, a0.S4; \
	VFMLA lo.S4, V2.S4, a1.S4; \
	VFMLA lo.S4, V4.S4, a2.S4; \
	VFMLA hi.S4, V1.S4, a0.S4; \
	VFMLA hi.S4, V3.S4, a1.S4; \
	VFMLA hi.S4, V5.S4, a2.S4

#define FMA24 \
	ROW(V6, V7, V14, V15, V16); \
	ROW(V8, V9, V17, V18, V19); \
	ROW(V10, V11, V20, V21, V22); \
	ROW(V12, V13, V23, V24, V25)

#define PUT(a) \
	VST1.P [a.S4], 16(R8); \
	VST1.P [V31.S4], 16(R8)

#define STORE \
	MOVD out+40(FP), R8; \
	PUT(V14); PUT(V15); PUT(V16); PUT(V17); \
	PUT(V18); PUT(V19); PUT(V20); PUT(V21); \
	PUT(V22); PUT(V23); PUT(V24); PUT(V25)

// func dot4x3F32(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)
TEXT ·dot4x3F32(SB), NOSPLIT, $0-48
	ARGS(2)

f32loop:
	LOADX
	VLD1.P 32(R0), [V6.S4, V7.S4]
	VLD1.P 32(R1), [V8.S4, V9.S4]
	VLD1.P 32(R2), [V10.S4, V11.S4]
	VLD1.P 32(R3), [V12.S4, V13.S4]
	FMA24
	SUBS $8, R7, R7
	BNE  f32loop
	STORE
	RET

// func dot4x3BF16(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)
TEXT ·dot4x3BF16(SB), NOSPLIT, $0-48
	ARGS(1)

bfloop:
	LOADX
	VLD1.P 16(R0), [V6.H8]
	VLD1.P 16(R1), [V8.H8]
	VLD1.P 16(R2), [V10.H8]
	VLD1.P 16(R3), [V12.H8]
	WORD $0x4e467be7 /* zip2 v7.8h, v31.8h, v6.8h */
	WORD $0x4e463be6 /* zip1 v6.8h, v31.8h, v6.8h */
	WORD $0x4e487be9 /* zip2 v9.8h, v31.8h, v8.8h */
	WORD $0x4e483be8 /* zip1 v8.8h, v31.8h, v8.8h */
	WORD $0x4e4a7beb /* zip2 v11.8h, v31.8h, v10.8h */
	WORD $0x4e4a3bea /* zip1 v10.8h, v31.8h, v10.8h */
	WORD $0x4e4c7bed /* zip2 v13.8h, v31.8h, v12.8h */
	WORD $0x4e4c3bec /* zip1 v12.8h, v31.8h, v12.8h */
	FMA24
	SUBS $8, R7, R7
	BNE  bfloop
	STORE
	RET
