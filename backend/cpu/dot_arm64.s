#include "textflag.h"
#include "neon_arm64.h"

// The NEON float32 and bf16 dot products: FMLA on 4 lanes, bf16 widened
// to float32 by ZIP1/ZIP2 with a zero vector (the 16 bits into the high
// half of each lane). Instructions Go's assembler has no mnemonic for are
// WORDs with their GNU syntax in a comment (dev/arm64/words.sh checks them).

// HSUM16: V16 + V17 + V18 + V19, all lanes, into F16.
#define HSUM16 \
	WORD $0x4e31d610 /* fadd v16.4s, v16.4s, v17.4s */; \
	WORD $0x4e33d652 /* fadd v18.4s, v18.4s, v19.4s */; \
	WORD $0x4e32d610 /* fadd v16.4s, v16.4s, v18.4s */; \
	WORD $0x6e30d610 /* faddp v16.4s, v16.4s, v16.4s */; \
	WORD $0x7e30da10 /* faddp s16, v16.2s */

// func dotF32NEON(x, w *float32, n int) float32
// Σ x[i]·w[i] for n a multiple of 4: four accumulators, 16 floats a step.
TEXT ·dotF32NEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	ZERO4(V16, V17, V18, V19)

f32loop16:
	CMP  $16, R2
	BLT  f32loop4
	VLD1.P 64(R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1.P 64(R1), [V4.S4, V5.S4, V6.S4, V7.S4]
	VFMLA V4.S4, V0.S4, V16.S4
	VFMLA V5.S4, V1.S4, V17.S4
	VFMLA V6.S4, V2.S4, V18.S4
	VFMLA V7.S4, V3.S4, V19.S4
	SUB  $16, R2, R2
	B    f32loop16

f32loop4:
	CBZ  R2, f32done
	VLD1.P 16(R0), [V0.S4]
	VLD1.P 16(R1), [V4.S4]
	VFMLA V4.S4, V0.S4, V16.S4
	SUB  $4, R2, R2
	B    f32loop4

f32done:
	HSUM16
	FMOVS F16, ret+24(FP)
	RET

// func dotBF16NEON(x *float32, w *uint16, n int) float32
// Σ x[i]·bf16(w[i]) for n a multiple of 4.
TEXT ·dotBF16NEON(SB), NOSPLIT, $0-28
	MOVD x+0(FP), R0
	MOVD w+8(FP), R1
	MOVD n+16(FP), R2
	ZERO4(V16, V17, V18, V19)
	VEOR V31.B16, V31.B16, V31.B16

bfloop16:
	CMP  $16, R2
	BLT  bfloop4
	VLD1.P 32(R1), [V4.H8, V5.H8]
	WORD $0x4e443be6 /* zip1 v6.8h, v31.8h, v4.8h */
	WORD $0x4e447be7 /* zip2 v7.8h, v31.8h, v4.8h */
	WORD $0x4e453be8 /* zip1 v8.8h, v31.8h, v5.8h */
	WORD $0x4e457be9 /* zip2 v9.8h, v31.8h, v5.8h */
	VLD1.P 64(R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VFMLA V6.S4, V0.S4, V16.S4
	VFMLA V7.S4, V1.S4, V17.S4
	VFMLA V8.S4, V2.S4, V18.S4
	VFMLA V9.S4, V3.S4, V19.S4
	SUB  $16, R2, R2
	B    bfloop16

bfloop4:
	CBZ  R2, bfdone
	FMOVD.P 8(R1), F4
	WORD $0x4e443be6 /* zip1 v6.8h, v31.8h, v4.8h */
	VLD1.P 16(R0), [V0.S4]
	VFMLA V6.S4, V0.S4, V16.S4
	SUB  $4, R2, R2
	B    bfloop4

bfdone:
	HSUM16
	FMOVS F16, ret+24(FP)
	RET

// func dot4BF16NEON(w *uint16, ldw int, x *float32, k int, out *[4]float32)
// The dot products of 4 bf16 rows (ldw apart) with x, k a multiple of 8:
// x loaded once for the 4 rows, two accumulators a row (V16..V23).
TEXT ·dot4BF16NEON(SB), NOSPLIT, $0-40
	MOVD w+0(FP), R0
	MOVD ldw+8(FP), R9
	LSL  $1, R9, R9
	ADD  R9, R0, R1
	ADD  R9, R1, R2
	ADD  R9, R2, R3
	MOVD x+16(FP), R4
	MOVD k+24(FP), R5
	ZERO4(V16, V17, V18, V19)
	ZERO4(V20, V21, V22, V23)
	VEOR V31.B16, V31.B16, V31.B16

d4loop:
	VLD1.P 32(R4), [V0.S4, V1.S4]
	VLD1.P 16(R0), [V4.H8]
	VLD1.P 16(R1), [V5.H8]
	VLD1.P 16(R2), [V6.H8]
	VLD1.P 16(R3), [V7.H8]
	WORD $0x4e443be8 /* zip1 v8.8h, v31.8h, v4.8h */
	WORD $0x4e447be9 /* zip2 v9.8h, v31.8h, v4.8h */
	WORD $0x4e453bea /* zip1 v10.8h, v31.8h, v5.8h */
	WORD $0x4e457beb /* zip2 v11.8h, v31.8h, v5.8h */
	WORD $0x4e463bec /* zip1 v12.8h, v31.8h, v6.8h */
	WORD $0x4e467bed /* zip2 v13.8h, v31.8h, v6.8h */
	WORD $0x4e473bee /* zip1 v14.8h, v31.8h, v7.8h */
	WORD $0x4e477bef /* zip2 v15.8h, v31.8h, v7.8h */
	VFMLA V8.S4, V0.S4, V16.S4
	VFMLA V9.S4, V1.S4, V17.S4
	VFMLA V10.S4, V0.S4, V18.S4
	VFMLA V11.S4, V1.S4, V19.S4
	VFMLA V12.S4, V0.S4, V20.S4
	VFMLA V13.S4, V1.S4, V21.S4
	VFMLA V14.S4, V0.S4, V22.S4
	VFMLA V15.S4, V1.S4, V23.S4
	SUBS $8, R5, R5
	BNE  d4loop

	SUM4ROWS
	MOVD out+32(FP), R6
	VST1 [V16.S4], (R6)
	RET
