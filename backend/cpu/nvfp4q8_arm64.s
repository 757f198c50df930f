#include "textflag.h"
#include "neon_arm64.h"

// The NEON int8 kernels of the NVFP4 path (nvfp4q8.go has the layout): the
// repacked codes are decoded to 2*e2m1 int8 with one TBL per 16 nibbles
// (q8tbl), multiplied with the int8 activations per block of 16 by SDOT
// (dot4Q8SDOT, row4Q8SDOT; ARMv8.2 dot product) or by SMULL, SMLAL2 and
// SADDLP (dot4Q8NEON, row4Q8NEON; any ARMv8), the 8 block sums of a row and
// group reduced by ADDP into two vectors in the scale order q8Order
// (blocks 0 2 4 6 | 1 3 5 7), converted to float32 and accumulated with
// FMLA times (weight scale * activation scale). The codes' 16 bytes at
// offset 16i of a row's group hold blocks i/2*4 + i%2 (low nibbles) and
// that + 2 (high nibbles).
//
// Instructions Go's assembler has no mnemonic for are WORDs with their GNU
// syntax in a comment; dev/arm64/words.sh checks them against GNU as.

// 2*e2m1 of the 16 codes as int8: 0 1 2 3 4 6 8 12, then negated.
DATA q8tbl<>+0(SB)/8, $0x0c08060403020100
DATA q8tbl<>+8(SB)/8, $0xf4f8fafcfdfeff00
GLOBL q8tbl<>(SB), RODATA|NOPTR, $16

// SETUP: V10 the table, V11 the low-nibble mask, V26 q8ScaleBias in each
// lane, V12-V15 the four float accumulators zeroed.
#define SETUP \
	MOVD $q8tbl<>(SB), R8; \
	VLD1 (R8), [V10.B16]; \
	VMOVI $15, V11.B16; \
	MOVW $0x3a800000, R8; \
	VDUP R8, V26.S4; \
	ZERO4(V12, V13, V14, V15)

// DEC(c, lo, hi): lo, hi = 2*e2m1 of c's low and high nibbles.
#define DEC(c, lo, hi) \
	VAND V11.B16, c.B16, lo.B16; \
	VUSHR $4, c.B16, hi.B16; \
	VTBL lo.B16, [V10.B16], lo.B16; \
	VTBL hi.B16, [V10.B16], hi.B16

// WSCALE(lo, hi): the 8 q8Scale codes of a row and group loaded into lo
// (low 8 bytes) turned into float32: lo = positions 0..3, hi = 4..7 (the
// shift by 20 split over the two widenings, at most 15 each).
#define WSCALE(lo, hi) \
	VUSHLL $5, lo.B8, lo.H8; \
	VUSHLL2 $15, lo.H8, hi.S4; \
	VUSHLL $15, lo.H4, lo.S4; \
	VADD V26.S4, lo.S4, lo.S4; \
	VADD V26.S4, hi.S4, hi.S4

// DOT4END: the sums of V12..V15 into V12 (one lane each), stored at out.
#define DOT4END \
	WORD $0x6e2dd58c /* faddp v12.4s, v12.4s, v13.4s */; \
	WORD $0x6e2fd5ce /* faddp v14.4s, v14.4s, v15.4s */; \
	WORD $0x6e2ed58c /* faddp v12.4s, v12.4s, v14.4s */; \
	MOVD out+40(FP), R5; \
	VST1 [V12.S4], (R5)

// dot4Q8: V0..V7 the group's 128 activations, V8 V9 their block scales;
// per row the codes in V16 V17 (two loads of 32 bytes), block sums in
// V18..V21, then V22 = blocks 0 2 4 6, V23 = blocks 1 3 5 7.

// ROWSCALE(acc): acc += V22 * wscale[0..3] * V8 + V23 * wscale[4..7] * V9,
// the row's 8 scale codes read at R1 (advanced by 8).
#define ROWSCALE(acc) \
	WORD $0x4e21dad6 /* scvtf v22.4s, v22.4s */; \
	WORD $0x4e21daf7 /* scvtf v23.4s, v23.4s */; \
	FMOVD.P 8(R1), F27; \
	WSCALE(V27, V28); \
	WORD $0x6e28df7b /* fmul v27.4s, v27.4s, v8.4s */; \
	WORD $0x6e29df9c /* fmul v28.4s, v28.4s, v9.4s */; \
	VFMLA V27.S4, V22.S4, acc.S4; \
	VFMLA V28.S4, V23.S4, acc.S4

#define ROWSDOT(acc) \
	VLD1.P 32(R0), [V16.B16, V17.B16]; \
	ZERO4(V18, V19, V20, V21); \
	DEC(V16, V24, V25); \
	WORD $0x4e809712 /* sdot v18.4s, v24.16b, v0.16b */; \
	WORD $0x4e829733 /* sdot v19.4s, v25.16b, v2.16b */; \
	DEC(V17, V24, V25); \
	WORD $0x4e819714 /* sdot v20.4s, v24.16b, v1.16b */; \
	WORD $0x4e839735 /* sdot v21.4s, v25.16b, v3.16b */; \
	WORD $0x4eb3be56 /* addp v22.4s, v18.4s, v19.4s */; \
	WORD $0x4eb5be97 /* addp v23.4s, v20.4s, v21.4s */; \
	VLD1.P 32(R0), [V16.B16, V17.B16]; \
	ZERO4(V18, V19, V20, V21); \
	DEC(V16, V24, V25); \
	WORD $0x4e849712 /* sdot v18.4s, v24.16b, v4.16b */; \
	WORD $0x4e869733 /* sdot v19.4s, v25.16b, v6.16b */; \
	DEC(V17, V24, V25); \
	WORD $0x4e859714 /* sdot v20.4s, v24.16b, v5.16b */; \
	WORD $0x4e879735 /* sdot v21.4s, v25.16b, v7.16b */; \
	WORD $0x4eb3be52 /* addp v18.4s, v18.4s, v19.4s */; \
	WORD $0x4eb5be94 /* addp v20.4s, v20.4s, v21.4s */; \
	WORD $0x4eb2bed6 /* addp v22.4s, v22.4s, v18.4s */; \
	WORD $0x4eb4bef7 /* addp v23.4s, v23.4s, v20.4s */; \
	ROWSCALE(acc)

#define ROWSMULL(acc) \
	VLD1.P 32(R0), [V16.B16, V17.B16]; \
	DEC(V16, V24, V25); \
	WORD $0x0e20c312 /* smull v18.8h, v24.8b, v0.8b */; \
	WORD $0x4e208312 /* smlal2 v18.8h, v24.16b, v0.16b */; \
	WORD $0x4e602a52 /* saddlp v18.4s, v18.8h */; \
	WORD $0x0e22c333 /* smull v19.8h, v25.8b, v2.8b */; \
	WORD $0x4e228333 /* smlal2 v19.8h, v25.16b, v2.16b */; \
	WORD $0x4e602a73 /* saddlp v19.4s, v19.8h */; \
	DEC(V17, V24, V25); \
	WORD $0x0e21c314 /* smull v20.8h, v24.8b, v1.8b */; \
	WORD $0x4e218314 /* smlal2 v20.8h, v24.16b, v1.16b */; \
	WORD $0x4e602a94 /* saddlp v20.4s, v20.8h */; \
	WORD $0x0e23c335 /* smull v21.8h, v25.8b, v3.8b */; \
	WORD $0x4e238335 /* smlal2 v21.8h, v25.16b, v3.16b */; \
	WORD $0x4e602ab5 /* saddlp v21.4s, v21.8h */; \
	WORD $0x4eb3be56 /* addp v22.4s, v18.4s, v19.4s */; \
	WORD $0x4eb5be97 /* addp v23.4s, v20.4s, v21.4s */; \
	VLD1.P 32(R0), [V16.B16, V17.B16]; \
	DEC(V16, V24, V25); \
	WORD $0x0e24c312 /* smull v18.8h, v24.8b, v4.8b */; \
	WORD $0x4e248312 /* smlal2 v18.8h, v24.16b, v4.16b */; \
	WORD $0x4e602a52 /* saddlp v18.4s, v18.8h */; \
	WORD $0x0e26c333 /* smull v19.8h, v25.8b, v6.8b */; \
	WORD $0x4e268333 /* smlal2 v19.8h, v25.16b, v6.16b */; \
	WORD $0x4e602a73 /* saddlp v19.4s, v19.8h */; \
	DEC(V17, V24, V25); \
	WORD $0x0e25c314 /* smull v20.8h, v24.8b, v5.8b */; \
	WORD $0x4e258314 /* smlal2 v20.8h, v24.16b, v5.16b */; \
	WORD $0x4e602a94 /* saddlp v20.4s, v20.8h */; \
	WORD $0x0e27c335 /* smull v21.8h, v25.8b, v7.8b */; \
	WORD $0x4e278335 /* smlal2 v21.8h, v25.16b, v7.16b */; \
	WORD $0x4e602ab5 /* saddlp v21.4s, v21.8h */; \
	WORD $0x4eb3be52 /* addp v18.4s, v18.4s, v19.4s */; \
	WORD $0x4eb5be94 /* addp v20.4s, v20.4s, v21.4s */; \
	WORD $0x4eb2bed6 /* addp v22.4s, v22.4s, v18.4s */; \
	WORD $0x4eb4bef7 /* addp v23.4s, v23.4s, v20.4s */; \
	ROWSCALE(acc)

// func dot4Q8SDOT(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)
// The dot products of a quad's 4 rows with one token (dot4Q8Go).
TEXT ·dot4Q8SDOT(SB), NOSPLIT, $0-48
	MOVD codes+0(FP), R0
	MOVD scales+8(FP), R1
	MOVD x+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD groups+32(FP), R4
	SETUP

sdot4group:
	VLD1.P 64(R2), [V0.B16, V1.B16, V2.B16, V3.B16]
	VLD1.P 64(R2), [V4.B16, V5.B16, V6.B16, V7.B16]
	VLD1.P 32(R3), [V8.S4, V9.S4]
	ROWSDOT(V12)
	ROWSDOT(V13)
	ROWSDOT(V14)
	ROWSDOT(V15)
	SUBS $1, R4, R4
	BNE  sdot4group
	DOT4END
	RET

// func dot4Q8NEON(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)
// dot4Q8SDOT with SMULL/SMLAL2/SADDLP for the processors without SDOT.
TEXT ·dot4Q8NEON(SB), NOSPLIT, $0-48
	MOVD codes+0(FP), R0
	MOVD scales+8(FP), R1
	MOVD x+16(FP), R2
	MOVD xs+24(FP), R3
	MOVD groups+32(FP), R4
	SETUP

neon4group:
	VLD1.P 64(R2), [V0.B16, V1.B16, V2.B16, V3.B16]
	VLD1.P 64(R2), [V4.B16, V5.B16, V6.B16, V7.B16]
	VLD1.P 32(R3), [V8.S4, V9.S4]
	ROWSMULL(V12)
	ROWSMULL(V13)
	ROWSMULL(V14)
	ROWSMULL(V15)
	SUBS $1, R4, R4
	BNE  neon4group
	DOT4END
	RET

// row4Q8: per group the row's codes decoded once into V16..V23 (blocks
// 0 2 1 3 4 6 5 7), its scales in V24 V25; per token the 128 activations
// in V0..V7, block sums in V27..V30, V8 = blocks 0 2 4 6, V9 = 1 3 5 7,
// the token's block scales in V0 V1. Token t's activations are at
// R7 = R2 + t*R6, its scales at R9 = R3 + t*R10.

// ROW4DEC: the row's group at R0 decoded, its scales at R1 converted; R0
// and R1 advanced to the row's next group (256 and 32 bytes on).
#define ROW4DEC \
	VLD1 (R0), [V20.B16, V21.B16, V22.B16, V23.B16]; \
	ADD $256, R0, R0; \
	DEC(V20, V16, V17); \
	DEC(V21, V18, V19); \
	DEC(V22, V20, V22); \
	DEC(V23, V21, V23); \
	FMOVD (R1), F24; \
	ADD $32, R1, R1; \
	WSCALE(V24, V25)

// TOKSCALE(acc): acc += V8 * V24 * xs[0..3] + V9 * V25 * xs[4..7], the
// token's scales read at R9; R7 and R9 advanced to the next token.
#define TOKSCALE(acc) \
	WORD $0x4e21d908 /* scvtf v8.4s, v8.4s */; \
	WORD $0x4e21d929 /* scvtf v9.4s, v9.4s */; \
	VLD1 (R9), [V0.S4, V1.S4]; \
	WORD $0x6e38dc00 /* fmul v0.4s, v0.4s, v24.4s */; \
	WORD $0x6e39dc21 /* fmul v1.4s, v1.4s, v25.4s */; \
	VFMLA V0.S4, V8.S4, acc.S4; \
	VFMLA V1.S4, V9.S4, acc.S4; \
	ADD R6, R7, R7; \
	ADD R10, R9, R9

#define TOKSDOT(acc) \
	VLD1 (R7), [V0.B16, V1.B16, V2.B16, V3.B16]; \
	ADD $64, R7, R11; \
	VLD1 (R11), [V4.B16, V5.B16, V6.B16, V7.B16]; \
	ZERO4(V27, V28, V29, V30); \
	WORD $0x4e80961b /* sdot v27.4s, v16.16b, v0.16b */; \
	WORD $0x4e82963c /* sdot v28.4s, v17.16b, v2.16b */; \
	WORD $0x4e81965d /* sdot v29.4s, v18.16b, v1.16b */; \
	WORD $0x4e83967e /* sdot v30.4s, v19.16b, v3.16b */; \
	WORD $0x4ebcbf68 /* addp v8.4s, v27.4s, v28.4s */; \
	WORD $0x4ebebfa9 /* addp v9.4s, v29.4s, v30.4s */; \
	ZERO4(V27, V28, V29, V30); \
	WORD $0x4e84969b /* sdot v27.4s, v20.16b, v4.16b */; \
	WORD $0x4e8696dc /* sdot v28.4s, v22.16b, v6.16b */; \
	WORD $0x4e8596bd /* sdot v29.4s, v21.16b, v5.16b */; \
	WORD $0x4e8796fe /* sdot v30.4s, v23.16b, v7.16b */; \
	WORD $0x4ebcbf7b /* addp v27.4s, v27.4s, v28.4s */; \
	WORD $0x4ebebfbd /* addp v29.4s, v29.4s, v30.4s */; \
	WORD $0x4ebbbd08 /* addp v8.4s, v8.4s, v27.4s */; \
	WORD $0x4ebdbd29 /* addp v9.4s, v9.4s, v29.4s */; \
	TOKSCALE(acc)

#define TOKSMULL(acc) \
	VLD1 (R7), [V0.B16, V1.B16, V2.B16, V3.B16]; \
	ADD $64, R7, R11; \
	VLD1 (R11), [V4.B16, V5.B16, V6.B16, V7.B16]; \
	WORD $0x0e20c21b /* smull v27.8h, v16.8b, v0.8b */; \
	WORD $0x4e20821b /* smlal2 v27.8h, v16.16b, v0.16b */; \
	WORD $0x4e602b7b /* saddlp v27.4s, v27.8h */; \
	WORD $0x0e22c23c /* smull v28.8h, v17.8b, v2.8b */; \
	WORD $0x4e22823c /* smlal2 v28.8h, v17.16b, v2.16b */; \
	WORD $0x4e602b9c /* saddlp v28.4s, v28.8h */; \
	WORD $0x0e21c25d /* smull v29.8h, v18.8b, v1.8b */; \
	WORD $0x4e21825d /* smlal2 v29.8h, v18.16b, v1.16b */; \
	WORD $0x4e602bbd /* saddlp v29.4s, v29.8h */; \
	WORD $0x0e23c27e /* smull v30.8h, v19.8b, v3.8b */; \
	WORD $0x4e23827e /* smlal2 v30.8h, v19.16b, v3.16b */; \
	WORD $0x4e602bde /* saddlp v30.4s, v30.8h */; \
	WORD $0x4ebcbf68 /* addp v8.4s, v27.4s, v28.4s */; \
	WORD $0x4ebebfa9 /* addp v9.4s, v29.4s, v30.4s */; \
	WORD $0x0e24c29b /* smull v27.8h, v20.8b, v4.8b */; \
	WORD $0x4e24829b /* smlal2 v27.8h, v20.16b, v4.16b */; \
	WORD $0x4e602b7b /* saddlp v27.4s, v27.8h */; \
	WORD $0x0e26c2dc /* smull v28.8h, v22.8b, v6.8b */; \
	WORD $0x4e2682dc /* smlal2 v28.8h, v22.16b, v6.16b */; \
	WORD $0x4e602b9c /* saddlp v28.4s, v28.8h */; \
	WORD $0x0e25c2bd /* smull v29.8h, v21.8b, v5.8b */; \
	WORD $0x4e2582bd /* smlal2 v29.8h, v21.16b, v5.16b */; \
	WORD $0x4e602bbd /* saddlp v29.4s, v29.8h */; \
	WORD $0x0e27c2fe /* smull v30.8h, v23.8b, v7.8b */; \
	WORD $0x4e2782fe /* smlal2 v30.8h, v23.16b, v7.16b */; \
	WORD $0x4e602bde /* saddlp v30.4s, v30.8h */; \
	WORD $0x4ebcbf7b /* addp v27.4s, v27.4s, v28.4s */; \
	WORD $0x4ebebfbd /* addp v29.4s, v29.4s, v30.4s */; \
	WORD $0x4ebbbd08 /* addp v8.4s, v8.4s, v27.4s */; \
	WORD $0x4ebdbd29 /* addp v9.4s, v9.4s, v29.4s */; \
	TOKSCALE(acc)

// ROW4ARGS: R0 codes, R1 scales, R2 x, R3 xs, R4 groups, R6 = groups*128
// (bytes between tokens' activations), R10 = groups*32 (between their
// scales).
#define ROW4ARGS \
	MOVD codes+0(FP), R0; \
	MOVD scales+8(FP), R1; \
	MOVD x+16(FP), R2; \
	MOVD xs+24(FP), R3; \
	MOVD groups+32(FP), R4; \
	LSL $7, R4, R6; \
	LSL $5, R4, R10

// func row4Q8SDOT(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)
// One row (codes and scales at its place in its quad) with 4 tokens, whose
// activations and scales are consecutive (row4Q8Go).
TEXT ·row4Q8SDOT(SB), NOSPLIT, $0-48
	ROW4ARGS
	SETUP

sdotrowgroup:
	ROW4DEC
	MOVD R2, R7
	MOVD R3, R9
	TOKSDOT(V12)
	TOKSDOT(V13)
	TOKSDOT(V14)
	TOKSDOT(V15)
	ADD  $128, R2, R2
	ADD  $32, R3, R3
	SUBS $1, R4, R4
	BNE  sdotrowgroup
	DOT4END
	RET

// func row4Q8NEON(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)
// row4Q8SDOT with SMULL/SMLAL2/SADDLP.
TEXT ·row4Q8NEON(SB), NOSPLIT, $0-48
	ROW4ARGS
	SETUP

neonrowgroup:
	ROW4DEC
	MOVD R2, R7
	MOVD R3, R9
	TOKSMULL(V12)
	TOKSMULL(V13)
	TOKSMULL(V14)
	TOKSMULL(V15)
	ADD  $128, R2, R2
	ADD  $32, R3, R3
	SUBS $1, R4, R4
	BNE  neonrowgroup
	DOT4END
	RET
