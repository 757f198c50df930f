#include "textflag.h"

// 2*e2m1(code) + 12 as uint8 by 4-bit code (VPSHUFB table, both lanes):
// 12 13 14 15 16 18 20 24, then 12 11 10 9 8 6 4 0. The offset makes the
// weights unsigned for VPMADDUBSW; its product with the activations,
// 12 * the block's sum of them, is subtracted once per block.
DATA q8lut<>+0(SB)/8, $0x181412100f0e0d0c
DATA q8lut<>+8(SB)/8, $0x00040608090a0b0c
DATA q8lut<>+16(SB)/8, $0x181412100f0e0d0c
DATA q8lut<>+24(SB)/8, $0x00040608090a0b0c
GLOBL q8lut<>(SB), RODATA|NOPTR, $32

DATA q8nib<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q8nib<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q8nib<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q8nib<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q8nib<>(SB), RODATA|NOPTR, $32

DATA q8ones<>+0(SB)/8, $0x0001000100010001
DATA q8ones<>+8(SB)/8, $0x0001000100010001
DATA q8ones<>+16(SB)/8, $0x0001000100010001
DATA q8ones<>+24(SB)/8, $0x0001000100010001
GLOBL q8ones<>(SB), RODATA|NOPTR, $32

// 117<<23: a q8Scale code shifted left by 20 plus this is its float32.
DATA q8bias<>+0(SB)/8, $0x3a8000003a800000
DATA q8bias<>+8(SB)/8, $0x3a8000003a800000
DATA q8bias<>+16(SB)/8, $0x3a8000003a800000
DATA q8bias<>+24(SB)/8, $0x3a8000003a800000
GLOBL q8bias<>(SB), RODATA|NOPTR, $32

// Q8ARGS loads the arguments both kernels share: DI codes, DX scales, SI
// x, R8 xs, R9 xsum, CX groups, AX out.
#define Q8ARGS \
	MOVQ codes+0(FP), DI; MOVQ scales+8(FP), DX; MOVQ x+16(FP), SI; MOVQ xs+24(FP), R8; \
	MOVQ xsum+32(FP), R9; MOVQ groups+40(FP), CX; MOVQ out+48(FP), AX

// Q8NEXT(cstep) moves the pointers on by one group (xsum by cstep bytes)
// and counts it.
#define Q8NEXT(cstep) \
	ADDQ $256, DI; ADDQ $32, DX; ADDQ $128, SI; ADDQ $32, R8; ADDQ $cstep, R9; DECQ CX

// SCSTRIDES: R13 the token stride of xs (groups*32 bytes), R10 3 of them.
#define SCSTRIDES \
	MOVQ CX, R13; SHLQ $5, R13; LEAQ (R13)(R13*2), R10

// Q8CONSTS loads the constants (Y4 bias, Y5 table, Y6 nibble mask, Y7
// int16 ones) and zeroes the accumulators Y12-Y15.
#define Q8CONSTS \
	VMOVDQU q8lut<>(SB), Y5; VMOVDQU q8nib<>(SB), Y6; VMOVDQU q8ones<>(SB), Y7; VMOVDQU q8bias<>(SB), Y4; \
	VXORPS Y12, Y12, Y12; VXORPS Y13, Y13, Y13; VXORPS Y14, Y14, Y14; VXORPS Y15, Y15, Y15

// Q8STORE stores the horizontal sums of Y12..Y15 to out[0..3] and returns.
#define Q8STORE \
	VHADDPS Y13, Y12, Y12; VHADDPS Y15, Y14, Y14; VHADDPS Y14, Y12, Y12; \
	VEXTRACTF128 $1, Y12, X13; VADDPS X13, X12, X12; VMOVUPS X12, (AX); \
	VZEROUPPER; RET

// NIBBLES(MOV, AND, MASK, TABLE, coff, L, H): the code bytes at coff(DI)
// (a YMM's or a ZMM's worth, loaded by MOV) as unsigned 2*e2m1+12 through
// TABLE: L the low nibbles, H the high (AND with MASK, 0x0f bytes).
#define NIBBLES(MOV, AND, MASK, TABLE, coff, L, H) \
	MOV coff(DI), L; VPSRLW $4, L, H; AND MASK, L, L; AND MASK, H, H; \
	VPSHUFB L, TABLE, L; VPSHUFB H, TABLE, H

// DECODE(coff, D0, D1): the 64 codes in the 32 bytes at coff(DI) as
// unsigned 2*e2m1+12: D0 elements 0..31, D1 elements 32..63.
#define DECODE(coff, D0, D1) NIBBLES(VMOVDQU, VPAND, Y6, Y5, coff, D0, D1)

// HALF(coff, xoff, D) leaves in D, as int16, the block sums of the
// products of the 64 codes packed in the 32 bytes at coff(DI) (low
// nibbles: elements 0..31, high: 32..63) with the int8 activations at
// xoff(SI): VPMADDUBSW's pair sums of each half, added pairwise across the
// two by VPHADDW into [b0 x4, b2 x4 | b1 x4, b3 x4] (the sums carry the +12
// offset of the codes; at most 4*6096, no overflow). Uses Y9.
#define HALF(coff, xoff, D) \
	DECODE(coff, D, Y9); \
	VPMADDUBSW xoff(SI), D, D; \
	VPMADDUBSW xoff+32(SI), Y9, Y9; \
	VPHADDW Y9, D, D

// ROW(j, ACC): one row of the quad, one group: ACC += block sums (int16
// pairs added once more, then widened by VPMADDWD into q8Order) times
// weight scales times activation scales. Uses Y0, Y1, Y8, Y9.
#define ROW(j, ACC) \
	HALF(j*64, 0, Y8); \
	HALF(j*64+32, 64, Y0); \
	VPHADDW Y0, Y8, Y8; \
	VPMADDWD Y7, Y8, Y8; \
	VPSUBD (R9), Y8, Y8; \
	VCVTDQ2PS Y8, Y8; \
	VPMOVZXBD j*8(DX), Y1; \
	VPSLLD $20, Y1, Y1; \
	VPADDD Y4, Y1, Y1; \
	VMULPS (R8), Y1, Y1; \
	VFMADD231PS Y1, Y8, ACC

// func dot4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)
TEXT ·dot4Q8AVX2(SB), NOSPLIT, $0-56
	Q8ARGS
	Q8CONSTS

q8loop:
	TESTQ CX, CX
	JE    q8done
	ROW(0, Y12)
	ROW(1, Y13)
	ROW(2, Y14)
	ROW(3, Y15)
	Q8NEXT(32)
	JMP  q8loop

q8done:
	Q8STORE

// TOK(XP, XSC, XSM, ACC): one token of the row's group: the products of the
// decoded Y0..Y3 with the 128 int8 at XP, summed per block in int16 (at
// most 4*6096 each, no overflow) and widened in the q8Order of the block
// sums, less the offset's share (XSM), times the weight scales (Y8) times
// the activation scales (XSC), into ACC. Uses Y9, Y10, Y11. The pairwise
// sums are VPMADDWD by ones and VPACKSSDW, not VPHADDW: the same int16
// lanes in the same order (no sum saturates), and on the AMD EPYC of
// 2026-12-08 the prefill matmul ran 55.7-59.3 GFLOP a CPU-second against
// 45.2-60.3 with VPHADDW (8 alternated rounds, medians 57.5 and 52.1:
// VPHADDW is several shuffle micro-ops on AMD and Intel alike).
#define TOK(XP, XSC, XSM, ACC) \
	VPMADDUBSW 0(XP), Y0, Y9; \
	VPMADDUBSW 32(XP), Y1, Y10; \
	VPMADDWD Y7, Y9, Y9; \
	VPMADDWD Y7, Y10, Y10; \
	VPACKSSDW Y10, Y9, Y9; \
	VPMADDUBSW 64(XP), Y2, Y10; \
	VPMADDUBSW 96(XP), Y3, Y11; \
	VPMADDWD Y7, Y10, Y10; \
	VPMADDWD Y7, Y11, Y11; \
	VPACKSSDW Y11, Y10, Y10; \
	VPMADDWD Y7, Y9, Y9; \
	VPMADDWD Y7, Y10, Y10; \
	VPACKSSDW Y10, Y9, Y9; \
	VPMADDWD Y7, Y9, Y9; \
	VPSUBD XSM, Y9, Y9; \
	VCVTDQ2PS Y9, Y9; \
	VMULPS XSC, Y8, Y10; \
	VFMADD231PS Y10, Y9, ACC

// func row4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)
// out[t] = the dot product of one weight row (codes and scales at the row's
// place in its quad: groups 256 and 32 bytes apart) with 4 tokens' quantized
// activations (x, xs and xsum of token t at t times their row stride),
// before the global scale. Each group of the row is decoded once for the 4.
TEXT ·row4Q8AVX2(SB), NOSPLIT, $0-56
	Q8ARGS
	MOVQ CX, BX
	SHLQ $7, BX              // x row stride: groups*128 bytes
	LEAQ (SI)(BX*1), R11     // token 1
	LEAQ (SI)(BX*2), R12     // token 2
	ADDQ R12, BX             // token 3
	SCSTRIDES
	Q8CONSTS

r4loop:
	TESTQ CX, CX
	JE    r4done
	DECODE(0, Y0, Y1)
	DECODE(32, Y2, Y3)
	VPMOVZXBD (DX), Y8
	VPSLLD $20, Y8, Y8
	VPADDD Y4, Y8, Y8
	TOK(SI, (R8), (R9), Y12)
	TOK(R11, (R8)(R13*1), (R9)(R13*1), Y13)
	TOK(R12, (R8)(R13*2), (R9)(R13*2), Y14)
	TOK(BX, (R8)(R10*1), (R9)(R10*1), Y15)
	ADDQ $128, R11; ADDQ $128, R12; ADDQ $128, BX
	Q8NEXT(32)
	JMP  r4loop

r4done:
	Q8STORE

// The AVX-512 VNNI NVFP4 kernels: VPDPBUSD multiplies the codes (unsigned,
// 2*e2m1+12 as above) with the int8 activations and adds each 4 products
// into an int32 lane: 64 products an instruction. The activations come in
// q8Act's VNNI form (x5, c5): each group's 128 values permuted to the
// codes' nibble order ([0..31, 64..95 | 32..63, 96..127]), so that the low
// nibbles of a row's 64 code bytes meet the first 64 and the high nibbles
// the last 64; the offset's share (-3 times the block's sum, in each of
// the block's 4 int32 lanes) starts the integer accumulators. The lanes of
// the two halves hold blocks 0 1 4 5 | 2 3 6 7, 4 lanes each; the 8
// products of weight and activation block scales are formed in q8Order in
// a YMM and spread to those lanes by VPERMPS.

// VPERMPS indexes from q8Order to the halves' lanes, as bytes (VPMOVZXBD):
// half 0 blocks 0 1 4 5 (q8Order places 0 4 2 6), half 1 blocks 2 3 6 7
// (places 1 5 3 7), each 4 times.
DATA q5idx<>+0(SB)/8, $0x0404040400000000
DATA q5idx<>+8(SB)/8, $0x0606060602020202
DATA q5idx<>+16(SB)/8, $0x0505050501010101
DATA q5idx<>+24(SB)/8, $0x0707070703030303
GLOBL q5idx<>(SB), RODATA|NOPTR, $32

// Q5CONSTS: Y4 bias, Z5 table, Z6 nibble mask, Z2/Z3 the VPERMPS indexes;
// zeroes the accumulators Z12-Z15.
#define Q5CONSTS \
	VMOVDQU q8bias<>(SB), Y4; VBROADCASTI64X4 q8lut<>(SB), Z5; VBROADCASTI64X4 q8nib<>(SB), Z6; \
	VPMOVZXBD q5idx<>+0(SB), Z2; VPMOVZXBD q5idx<>+16(SB), Z3; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

// Q5STORE: the horizontal sums of Z12..Z15 to out[0..3]; returns.
#define Q5STORE \
	VEXTRACTF64X4 $1, Z12, Y0; VADDPS Y0, Y12, Y12; \
	VEXTRACTF64X4 $1, Z13, Y0; VADDPS Y0, Y13, Y13; \
	VEXTRACTF64X4 $1, Z14, Y0; VADDPS Y0, Y14, Y14; \
	VEXTRACTF64X4 $1, Z15, Y0; VADDPS Y0, Y15, Y15; \
	Q8STORE

// DECODE5(coff, L, H): the 64 code bytes at coff(DI) as unsigned
// 2*e2m1+12: L the low nibbles, H the high.
#define DECODE5(coff, L, H) NIBBLES(VMOVDQU64, VPANDD, Z6, Z5, coff, L, H)

// WSCALE(soff, W): the 8 weight block scales at soff(DX) as float32 in
// q8Order (W a YMM).
#define WSCALE(soff, W) \
	VPMOVZXBD soff(DX), W; \
	VPSLLD $20, W, W; \
	VPADDD Y4, W, W

// DOT5(XP, CP, SP, L, H, W, ACC): ACC += the block sums of L, H with the
// activations at XP (offset share from CP) times the weight scales W times
// the activation scales at SP. Uses Z1, Z7..Z10.
#define DOT5(XP, CP, SP, L, H, W, ACC) \
	VMOVDQU64 0(CP), Z7; \
	VMOVDQU64 64(CP), Z8; \
	VPDPBUSD 0(XP), L, Z7; \
	VPDPBUSD 64(XP), H, Z8; \
	VMULPS SP, W, Y1; \
	VPERMPS Z1, Z2, Z9; \
	VPERMPS Z1, Z3, Z10; \
	VCVTDQ2PS Z7, Z7; \
	VCVTDQ2PS Z8, Z8; \
	VFMADD231PS Z9, Z7, ACC; \
	VFMADD231PS Z10, Z8, ACC

// ROW5(j, ACC): row j of the quad, one group, into ACC.
#define ROW5(j, ACC) \
	DECODE5(j*64, Z16, Z17); \
	WSCALE(j*8, Y11); \
	DOT5(SI, R9, (R8), Z16, Z17, Y11, ACC)

// func dot4Q8VNNI(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)
// As dot4Q8AVX2 with q8Act's VNNI form (x = x5, xsum = c5; xs = sc).
TEXT ·dot4Q8VNNI(SB), NOSPLIT, $0-56
	Q8ARGS
	Q5CONSTS

q5loop:
	TESTQ CX, CX
	JE    q5done
	// 8 groups ahead (the quads are consecutive): from main memory,
	// 1.03x over the hardware prefetcher alone (BenchmarkMatVec/nvfp4).
	PREFETCHT0 2048(DI); PREFETCHT0 2112(DI); PREFETCHT0 2176(DI); PREFETCHT0 2240(DI); PREFETCHT0 256(DX)
	ROW5(0, Z12)
	ROW5(1, Z13)
	ROW5(2, Z14)
	ROW5(3, Z15)
	Q8NEXT(128)
	JMP  q5loop

q5done:
	Q5STORE

// func row4Q8VNNI(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)
// As row4Q8AVX2 with q8Act's VNNI form: the 4 tokens' x5 and c5 are
// groups*128 bytes apart, their sc groups*32.
TEXT ·row4Q8VNNI(SB), NOSPLIT, $0-56
	Q8ARGS
	MOVQ CX, BX
	SHLQ $7, BX              // x5, c5 token stride: groups*128 bytes
	LEAQ (BX)(BX*2), R14     // 3 strides
	SCSTRIDES
	Q5CONSTS

r5loop:
	TESTQ CX, CX
	JE    r5done
	DECODE5(0, Z16, Z17)
	WSCALE(0, Y11)
	DOT5(SI, R9, (R8), Z16, Z17, Y11, Z12)
	LEAQ (SI)(BX*1), R11
	LEAQ (R9)(BX*1), R12
	DOT5(R11, R12, (R8)(R13*1), Z16, Z17, Y11, Z13)
	LEAQ (SI)(BX*2), R11
	LEAQ (R9)(BX*2), R12
	DOT5(R11, R12, (R8)(R13*2), Z16, Z17, Y11, Z14)
	LEAQ (SI)(R14*1), R11
	LEAQ (R9)(R14*1), R12
	DOT5(R11, R12, (R8)(R10*1), Z16, Z17, Y11, Z15)
	Q8NEXT(128)
	JMP  r5loop

r5done:
	Q5STORE

// The block-per-lane kernels (nvfp4q16.go): per supergroup of 256 elements
// a row's 128 code bytes decode (NIBBLES) into 4 ZMMs that VPDPBUSD with
// the activation's 4 chunks of 64, every product of block l landing in
// int32 lane l; the lanes start from the offset's correction (xc), turn
// into float32 once, and meet the product of the 16 weight block scales
// (VPMOVZXBD: one byte a lane, then shift and bias as in WSCALE) and the
// 16 activation block scales in one fused multiply-add.

// Q16CONSTS: Z4 bias, Z5 table, Z6 nibble mask; zeroes Z12-Z15.
#define Q16CONSTS \
	VPBROADCASTD q8bias<>(SB), Z4; VBROADCASTI64X4 q8lut<>(SB), Z5; VBROADCASTI64X4 q8nib<>(SB), Z6; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

// WSCALE16(soff, W): the 16 weight block scales at soff(DX) as float32.
#define WSCALE16(soff, W) \
	VPMOVZXBD soff(DX), W; \
	VPSLLD $20, W, W; \
	VPADDD Z4, W, W

// ROW16(j, ACC): row j of the quad, one supergroup, into ACC (the token's
// activations at SI, their scales at R8, corrections at R9). Uses Z16-Z21.
#define ROW16(j, ACC) \
	VMOVDQU64 (R9), Z20; \
	NIBBLES(VMOVDQU64, VPANDD, Z6, Z5, j*128, Z16, Z17); \
	VPDPBUSD 0(SI), Z16, Z20; \
	VPDPBUSD 64(SI), Z17, Z20; \
	NIBBLES(VMOVDQU64, VPANDD, Z6, Z5, j*128+64, Z18, Z19); \
	VPDPBUSD 128(SI), Z18, Z20; \
	VPDPBUSD 192(SI), Z19, Z20; \
	WSCALE16(j*16, Z21); \
	VMULPS (R8), Z21, Z21; \
	VCVTDQ2PS Z20, Z20; \
	VFMADD231PS Z21, Z20, ACC

// Q16NEXT moves the pointers on by one supergroup and counts it.
#define Q16NEXT \
	ADDQ $512, DI; ADDQ $64, DX; ADDQ $256, SI; ADDQ $64, R8; ADDQ $64, R9; DECQ CX

// func dot4Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[4]float32)
// out[j] = the dot product of row j of the quad (codes and scales at the
// quad: supergroups 512 and 64 bytes apart) with one token's activations,
// before the global scale.
TEXT ·dot4Q16VNNI(SB), NOSPLIT, $0-56
	Q8ARGS
	Q16CONSTS

d16loop:
	TESTQ CX, CX
	JE    d16done
	// 4 supergroups ahead, as dot4Q8VNNI's 8 groups.
	PREFETCHT0 2048(DI); PREFETCHT0 2112(DI); PREFETCHT0 2176(DI); PREFETCHT0 2240(DI)
	PREFETCHT0 2304(DI); PREFETCHT0 2368(DI); PREFETCHT0 2432(DI); PREFETCHT0 2496(DI)
	PREFETCHT0 256(DX)
	ROW16(0, Z12)
	ROW16(1, Z13)
	ROW16(2, Z14)
	ROW16(3, Z15)
	Q16NEXT
	JMP d16loop

d16done:
	Q5STORE

// ROWDEC16: the row's supergroup decoded into Z16-Z19, its weight scales
// into Z22.
#define ROWDEC16 \
	NIBBLES(VMOVDQU64, VPANDD, Z6, Z5, 0, Z16, Z17); \
	NIBBLES(VMOVDQU64, VPANDD, Z6, Z5, 64, Z18, Z19); \
	WSCALE16(0, Z22)

// TOK16(XP, SP, CP, ACC): one token of the row's supergroup: the decoded
// Z16-Z19 with the activations at (XP), from the corrections at CP, times
// the weight scales Z22 and the activation scales at SP, into ACC. Uses
// Z20, Z21.
#define TOK16(XP, SP, CP, ACC) \
	VMOVDQU64 CP, Z20; \
	VPDPBUSD 0(XP), Z16, Z20; \
	VPDPBUSD 64(XP), Z17, Z20; \
	VPDPBUSD 128(XP), Z18, Z20; \
	VPDPBUSD 192(XP), Z19, Z20; \
	VMULPS SP, Z22, Z21; \
	VCVTDQ2PS Z20, Z20; \
	VFMADD231PS Z21, Z20, ACC

// func row4Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[4]float32)
// out[t] = the dot product of one weight row (codes and scales at the row's
// place in its quad: supergroups 512 and 64 bytes apart) with 4 tokens'
// activations (x groups*256 bytes apart, xs and xc groups*64), before the
// global scale. Each supergroup of the row is decoded once for the 4.
TEXT ·row4Q16VNNI(SB), NOSPLIT, $0-56
	Q8ARGS
	MOVQ CX, BX
	SHLQ $8, BX              // x token stride: groups*256 bytes
	LEAQ (BX)(BX*2), R14     // 3 of them
	MOVQ CX, R13
	SHLQ $6, R13             // xs, xc token stride: groups*64 bytes
	LEAQ (R13)(R13*2), R10   // 3 of them
	Q16CONSTS

r16loop:
	TESTQ CX, CX
	JE    r16done
	ROWDEC16
	TOK16(SI, (R8), (R9), Z12)
	LEAQ (SI)(BX*1), R11
	TOK16(R11, (R8)(R13*1), (R9)(R13*1), Z13)
	LEAQ (SI)(BX*2), R11
	TOK16(R11, (R8)(R13*2), (R9)(R13*2), Z14)
	LEAQ (SI)(R14*1), R11
	TOK16(R11, (R8)(R10*1), (R9)(R10*1), Z15)
	Q16NEXT
	JMP r16loop

r16done:
	Q5STORE

// NEXTTOK moves the token pointers (R11 x, R12 xs, R14 xc) on by one token.
#define NEXTTOK ADDQ BX, R11; ADDQ R13, R12; ADDQ R13, R14

// HSUM4X(a, ya, b, yb, c, yc, d, yd): the horizontal sums of the ZMMs a..d
// (ya..yd their low halves) into X12, through Y0 and Y12-Y15 (VHADDPS has
// no EVEX form).
#define HSUM4X(a, ya, b, yb, c, yc, d, yd) \
	VEXTRACTF64X4 $1, a, Y0; VADDPS Y0, ya, Y12; \
	VEXTRACTF64X4 $1, b, Y0; VADDPS Y0, yb, Y13; \
	VEXTRACTF64X4 $1, c, Y0; VADDPS Y0, yc, Y14; \
	VEXTRACTF64X4 $1, d, Y0; VADDPS Y0, yd, Y15; \
	VHADDPS Y13, Y12, Y12; VHADDPS Y15, Y14, Y14; VHADDPS Y14, Y12, Y12; \
	VEXTRACTF128 $1, Y12, X13; VADDPS X13, X12, X12

// HSUM4(a, ya, b, yb, c, yc, d, yd, off): HSUM4X stored to
// off(AX)..off+12(AX).
#define HSUM4(a, ya, b, yb, c, yc, d, yd, off) \
	HSUM4X(a, ya, b, yb, c, yc, d, yd); VMOVUPS X12, off(AX)

// func row8Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[8]float32)
// row4Q16VNNI for 8 tokens: each supergroup of the row decoded once for
// the 8 (accumulators Z23-Z30).
TEXT ·row8Q16VNNI(SB), NOSPLIT, $0-56
	Q8ARGS
	MOVQ CX, BX
	SHLQ $8, BX              // x token stride: groups*256 bytes
	MOVQ CX, R13
	SHLQ $6, R13             // xs, xc token stride: groups*64 bytes
	Q16CONSTS
	VPXORD Z23, Z23, Z23; VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26
	VPXORD Z27, Z27, Z27; VPXORD Z28, Z28, Z28; VPXORD Z29, Z29, Z29; VPXORD Z30, Z30, Z30

r8loop:
	TESTQ CX, CX
	JE    r8done
	ROWDEC16
	MOVQ SI, R11; MOVQ R8, R12; MOVQ R9, R14
	TOK16(R11, (R12), (R14), Z23); NEXTTOK
	TOK16(R11, (R12), (R14), Z24); NEXTTOK
	TOK16(R11, (R12), (R14), Z25); NEXTTOK
	TOK16(R11, (R12), (R14), Z26); NEXTTOK
	TOK16(R11, (R12), (R14), Z27); NEXTTOK
	TOK16(R11, (R12), (R14), Z28); NEXTTOK
	TOK16(R11, (R12), (R14), Z29); NEXTTOK
	TOK16(R11, (R12), (R14), Z30)
	Q16NEXT
	JMP r8loop

r8done:
	HSUM4(Z23, Y23, Z24, Y24, Z25, Y25, Z26, Y26, 0)
	HSUM4(Z27, Y27, Z28, Y28, Z29, Y29, Z30, Y30, 16)
	VZEROUPPER
	RET

// ZERO8 zeroes the 8 accumulators Z23-Z30.
#define ZERO8 \
	VPXORD Z23, Z23, Z23; VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; \
	VPXORD Z27, Z27, Z27; VPXORD Z28, Z28, Z28; VPXORD Z29, Z29, Z29; VPXORD Z30, Z30, Z30

// func tile8Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups, gc, rows int, out *float32, ldo int, mul float32, acc *float32, flags int)
// row8Q16VNNI over rows consecutive weight rows (codes and scales at the
// first one's quad, which it starts; the rows' supergroups groups long),
// over gc of their supergroups from codes, scales, x, xs and xc on. With
// flags bit 0 each row's 8 accumulators start from acc (8 x 16 float32 a
// row, rows after rows) instead of zero; with bit 1 they are stored there,
// otherwise their sums times mul are stored to out: row r's token t at
// out + 4r + t*ldo bytes. Over all the chunks of a row's supergroups the
// same instructions in the same order as row8Q16VNNI and then a float32
// product per output: the same results as row8Q16VNNI's times mul,
// without a call per row, and a chunk's activations kept in L1 while the
// rows run over them.
TEXT ·tile8Q16VNNI(SB), NOSPLIT, $0-104
	MOVQ codes+0(FP), DI; MOVQ scales+8(FP), DX; MOVQ out+64(FP), AX
	MOVQ groups+40(FP), CX
	MOVQ CX, BX
	SHLQ $8, BX              // x token stride: groups*256 bytes
	MOVQ CX, R13
	SHLQ $6, R13             // xs, xc token stride: groups*64 bytes
	VPBROADCASTD q8bias<>(SB), Z4; VBROADCASTI64X4 q8lut<>(SB), Z5; VBROADCASTI64X4 q8nib<>(SB), Z6
	VBROADCASTSS mul+80(FP), X7
	XORQ R10, R10            // rows done

t8row:
	CMPQ R10, rows+56(FP)
	JGE  t8done
	MOVQ x+16(FP), SI; MOVQ xs+24(FP), R8; MOVQ xc+32(FP), R9; MOVQ gc+48(FP), CX
	TESTQ $1, flags+96(FP)
	JNE   t8load
	ZERO8
	JMP   t8loop

t8load:
	MOVQ  R10, R12
	SHLQ  $9, R12
	ADDQ  acc+88(FP), R12    // this row's 8 x 64 bytes of acc
	VMOVUPS 0(R12), Z23; VMOVUPS 64(R12), Z24; VMOVUPS 128(R12), Z25; VMOVUPS 192(R12), Z26
	VMOVUPS 256(R12), Z27; VMOVUPS 320(R12), Z28; VMOVUPS 384(R12), Z29; VMOVUPS 448(R12), Z30

t8loop:
	TESTQ CX, CX
	JE    t8sum
	ROWDEC16
	MOVQ SI, R11; MOVQ R8, R12; MOVQ R9, R14
	TOK16(R11, (R12), (R14), Z23); NEXTTOK
	TOK16(R11, (R12), (R14), Z24); NEXTTOK
	TOK16(R11, (R12), (R14), Z25); NEXTTOK
	TOK16(R11, (R12), (R14), Z26); NEXTTOK
	TOK16(R11, (R12), (R14), Z27); NEXTTOK
	TOK16(R11, (R12), (R14), Z28); NEXTTOK
	TOK16(R11, (R12), (R14), Z29); NEXTTOK
	TOK16(R11, (R12), (R14), Z30)
	Q16NEXT
	JMP t8loop

t8sum:
	TESTQ $2, flags+96(FP)
	JE    t8out
	MOVQ  R10, R12
	SHLQ  $9, R12
	ADDQ  acc+88(FP), R12
	VMOVUPS Z23, 0(R12); VMOVUPS Z24, 64(R12); VMOVUPS Z25, 128(R12); VMOVUPS Z26, 192(R12)
	VMOVUPS Z27, 256(R12); VMOVUPS Z28, 320(R12); VMOVUPS Z29, 384(R12); VMOVUPS Z30, 448(R12)
	JMP   t8next

t8out:
	HSUM4X(Z23, Y23, Z24, Y24, Z25, Y25, Z26, Y26)
	VMULPS X7, X12, X1
	HSUM4X(Z27, Y27, Z28, Y28, Z29, Y29, Z30, Y30)
	VMULPS X7, X12, X2
	MOVQ ldo+72(FP), R11
	VMOVSS X1, (AX)
	VEXTRACTPS $1, X1, (AX)(R11*1)
	LEAQ (AX)(R11*2), R12
	VEXTRACTPS $2, X1, (R12)
	VEXTRACTPS $3, X1, (R12)(R11*1)
	LEAQ (R12)(R11*2), R12
	VMOVSS X2, (R12)
	VEXTRACTPS $1, X2, (R12)(R11*1)
	LEAQ (R12)(R11*2), R12
	VEXTRACTPS $2, X2, (R12)
	VEXTRACTPS $3, X2, (R12)(R11*1)

t8next:
	ADDQ $4, AX
	// The next row: DI and DX are gc supergroups past this row's chunk;
	// the quad's next row is 128 (16) bytes after it, the next quad's
	// first row groups supergroups after the quad's first row.
	MOVQ  gc+48(FP), CX
	SHLQ  $6, CX
	SUBQ  CX, DX
	SHLQ  $3, CX
	SUBQ  CX, DI
	INCQ  R10
	TESTQ $3, R10
	JE    t8quad
	ADDQ  $16, DX
	ADDQ  $128, DI
	JMP   t8row

t8quad:
	MOVQ groups+40(FP), CX
	SHLQ $6, CX
	ADDQ CX, DX
	SUBQ $48, DX
	SHLQ $3, CX
	ADDQ CX, DI
	SUBQ $384, DI
	JMP  t8row

t8done:
	VZEROUPPER
	RET

// func dotsQ16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups, quads int, out *float32, mul float32)
// dot4Q16VNNI over quads consecutive quads of weight rows, each quad's 4
// sums times mul stored to out (4 floats a quad): the same results as
// dot4Q16VNNI's times mul, without a call per quad.
TEXT ·dotsQ16VNNI(SB), NOSPLIT, $0-68
	MOVQ codes+0(FP), DI; MOVQ scales+8(FP), DX; MOVQ out+56(FP), AX
	MOVQ quads+48(FP), R10
	VPBROADCASTD q8bias<>(SB), Z4; VBROADCASTI64X4 q8lut<>(SB), Z5; VBROADCASTI64X4 q8nib<>(SB), Z6
	VBROADCASTSS mul+64(FP), X7

dsquad:
	TESTQ R10, R10
	JE    dsdone
	MOVQ x+16(FP), SI; MOVQ xs+24(FP), R8; MOVQ xc+32(FP), R9; MOVQ groups+40(FP), CX
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

dsloop:
	TESTQ CX, CX
	JE    dssum
	PREFETCHT0 2048(DI); PREFETCHT0 2112(DI); PREFETCHT0 2176(DI); PREFETCHT0 2240(DI)
	PREFETCHT0 2304(DI); PREFETCHT0 2368(DI); PREFETCHT0 2432(DI); PREFETCHT0 2496(DI)
	PREFETCHT0 256(DX)
	ROW16(0, Z12)
	ROW16(1, Z13)
	ROW16(2, Z14)
	ROW16(3, Z15)
	Q16NEXT
	JMP dsloop

dssum:
	HSUM4X(Z12, Y12, Z13, Y13, Z14, Y14, Z15, Y15)
	VMULPS X7, X12, X12
	VMOVUPS X12, (AX)
	ADDQ $16, AX
	DECQ R10
	JMP  dsquad

dsdone:
	VZEROUPPER
	RET

// func quantQ16AVX512(x *float32, blocks int, q *int8, sc *float32, c *int32)
// quantizeQ16's q8QuantizeBlock for blocks whole blocks of 16 at x, block
// b's codes to q + (b/16)*256 + (b%16)*4 (4 bytes in each of the 4 chunks
// of 64), its scale to sc[b], -12 times its codes' sum to c[b]: the same
// float32 operations (amax/127, 1/s, x*inv, +-0.5, truncation) with the
// same results.
TEXT ·quantQ16AVX512(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ blocks+8(FP), CX
	MOVQ q+16(FP), DI
	MOVQ sc+24(FP), R8
	MOVQ c+32(FP), R9
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z8      // |x| mask
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Z9      // sign bit
	MOVL $0x3f000000, AX
	VPBROADCASTD AX, Z10     // 0.5
	MOVL $0x42fe0000, AX
	VMOVD AX, X11            // 127
	MOVL $0x3f800000, AX
	VMOVD AX, X13            // 1
	XORQ DX, DX              // block

qloop:
	CMPQ DX, CX
	JGE  qdone
	VMOVUPS (SI), Z0
	VPANDD Z8, Z0, Z1
	VEXTRACTI64X4 $1, Z1, Y2
	VPMAXUD Y2, Y1, Y1
	VEXTRACTI128 $1, Y1, X2
	VPMAXUD X2, X1, X1
	VPSHUFD $0x4e, X1, X2
	VPMAXUD X2, X1, X1
	VPSHUFD $0xb1, X1, X2
	VPMAXUD X2, X1, X1       // lane 0: the bits of amax (they order like the values)
	MOVQ DX, R10
	SHRQ $4, R10
	SHLQ $8, R10
	MOVQ DX, R11
	ANDQ $15, R11
	LEAQ (R10)(R11*4), R10
	ADDQ DI, R10             // the block's first 4 codes
	VMOVD X1, AX
	TESTL AX, AX
	JE   qzero
	VDIVSS X11, X1, X3       // s = amax/127
	VDIVSS X3, X13, X4       // inv = 1/s
	VBROADCASTSS X4, Z4
	VMULPS Z4, Z0, Z0        // r = x*inv
	VPANDD Z9, Z0, Z5
	VPORD  Z10, Z5, Z5       // +-0.5, the sign of r
	VADDPS Z5, Z0, Z0
	VCVTTPS2DQ Z0, Z0        // the codes, truncated
	VPMOVDB Z0, X5
	VEXTRACTI64X4 $1, Z0, Y6
	VPADDD Y6, Y0, Y0
	VEXTRACTI128 $1, Y0, X6
	VPADDD X6, X0, X0
	VPSHUFD $0x4e, X0, X6
	VPADDD X6, X0, X0
	VPSHUFD $0xb1, X0, X6
	VPADDD X6, X0, X0
	VMOVD X0, AX
	IMUL3L $-12, AX, AX
	VMOVSS X3, (R8)(DX*4)
	MOVL AX, (R9)(DX*4)
	VMOVD X5, (R10)
	VPEXTRD $1, X5, 64(R10)
	VPEXTRD $2, X5, 128(R10)
	VPEXTRD $3, X5, 192(R10)
	JMP  qnext

qzero:
	MOVL $0, (R8)(DX*4)
	MOVL $0, (R9)(DX*4)
	MOVL $0, (R10)
	MOVL $0, 64(R10)
	MOVL $0, 128(R10)
	MOVL $0, 192(R10)

qnext:
	ADDQ $64, SI
	INCQ DX
	JMP  qloop

qdone:
	VZEROUPPER
	RET
