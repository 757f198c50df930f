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

// HALF(coff, xoff, D) leaves in D the 8 int32 sums of 4 products each of
// the 64 codes packed in the 32 bytes at coff(DI) (low nibbles: elements
// 0..31, high: 32..63) with the int8 activations at xoff(SI): lanes 0-3 of
// D sum the first block of 16, lanes 4-7 the second, of each half.
// Returns phadd(lowHalf, highHalf) as block sums [b0 b0 b2 b2 | b1 b1 b3 b3].
// (The sums carry the +12 offset of the codes.) Uses Y9.
#define HALF(coff, xoff, D) \
	VMOVDQU coff(DI), D; \
	VPSRLW $4, D, Y9; \
	VPAND Y6, D, D; \
	VPAND Y6, Y9, Y9; \
	VPSHUFB D, Y5, D; \
	VPSHUFB Y9, Y5, Y9; \
	VPMADDUBSW xoff(SI), D, D; \
	VPMADDUBSW xoff+32(SI), Y9, Y9; \
	VPMADDWD Y7, D, D; \
	VPMADDWD Y7, Y9, Y9; \
	VPHADDD Y9, D, D

// ROW(j, ACC): one row of the quad, one group: ACC += block sums times
// weight scales times activation scales. Uses Y0, Y1, Y8, Y9.
#define ROW(j, ACC) \
	HALF(j*64, 0, Y8); \
	HALF(j*64+32, 64, Y0); \
	VPHADDD Y0, Y8, Y8; \
	VPSUBD (R9), Y8, Y8; \
	VCVTDQ2PS Y8, Y8; \
	VPMOVZXBD j*8(DX), Y1; \
	VPSLLD $20, Y1, Y1; \
	VPADDD Y4, Y1, Y1; \
	VMULPS (R8), Y1, Y1; \
	VFMADD231PS Y1, Y8, ACC

// func dot4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)
TEXT ·dot4Q8AVX2(SB), NOSPLIT, $0-56
	MOVQ codes+0(FP), DI
	MOVQ scales+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ xs+24(FP), R8
	MOVQ xsum+32(FP), R9
	MOVQ groups+40(FP), CX
	MOVQ out+48(FP), AX
	VMOVDQU q8lut<>(SB), Y5
	VMOVDQU q8nib<>(SB), Y6
	VMOVDQU q8ones<>(SB), Y7
	VMOVDQU q8bias<>(SB), Y4
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15

q8loop:
	TESTQ CX, CX
	JE    q8done
	ROW(0, Y12)
	ROW(1, Y13)
	ROW(2, Y14)
	ROW(3, Y15)
	ADDQ $256, DI
	ADDQ $32, DX
	ADDQ $128, SI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JMP  q8loop

q8done:
	VHADDPS Y13, Y12, Y12
	VHADDPS Y15, Y14, Y14
	VHADDPS Y14, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VMOVUPS X12, (AX)
	VZEROUPPER
	RET
