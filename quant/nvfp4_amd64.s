#include "textflag.h"

// 2*e2m1(code) as int8, indexed by the 4-bit code (VPSHUFB table):
// 0 1 2 3 4 6 8 12, then the same negated.
DATA nvfp4lut<>+0(SB)/8, $0x0c08060403020100
DATA nvfp4lut<>+8(SB)/8, $0xf4f8fafcfdfeff00
GLOBL nvfp4lut<>(SB), RODATA|NOPTR, $16

DATA nvfp4mask<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA nvfp4mask<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL nvfp4mask<>(SB), RODATA|NOPTR, $16

// DECODE16 turns the 8 packed bytes at off(DI) into 16 floats 2*e2m1 in
// element order (even element = low nibble): lo -> Ylo (elements 0-7),
// hi -> Yhi (elements 8-15). Uses X2, X3.
#define DECODE16(off, Ylo, Yhi) \
	VMOVQ off(DI), X2; \
	VPSRLW $4, X2, X3; \
	VPAND X8, X2, X2; \
	VPAND X8, X3, X3; \
	VPUNPCKLBW X3, X2, X2; \
	VPSHUFB X2, X7, X2; \
	VPMOVSXBD X2, Ylo; \
	VPSRLDQ $8, X2, X2; \
	VPMOVSXBD X2, Yhi; \
	VCVTDQ2PS Ylo, Ylo; \
	VCVTDQ2PS Yhi, Yhi

// BLOCK16(coff, xlo, xhi, soff, Ylo, Yhi, P, S, ACC): one block of 16,
// ACC += tbl[scale] * (its codes at coff(DI) · x at xlo(SI), xhi(SI)), the
// scale code at soff(DX); P holds the block's dot product, S its scale.
#define BLOCK16(coff, xlo, xhi, soff, Ylo, Yhi, P, S, ACC) \
	DECODE16(coff, Ylo, Yhi); \
	VMULPS xlo(SI), Ylo, P; \
	VFMADD231PS xhi(SI), Yhi, P; \
	MOVBLZX soff(DX), AX; \
	VBROADCASTSS (R8)(AX*4), S; \
	VFMADD231PS S, P, ACC

// func nvfp4DotAVX2(packed, scales *byte, x *float32, nblocks int, tbl *float32) float32
// Σ_b tbl[scales[b]] * Σ_{i<16} 2*e2m1(packed, 16b+i) * x[16b+i]; tbl holds
// half the E4M3 values, so the result is the row's dot product before the
// global scale. Two blocks a step, one accumulator each.
TEXT ·nvfp4DotAVX2(SB), NOSPLIT, $0-44
	MOVQ packed+0(FP), DI
	MOVQ scales+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ nblocks+24(FP), CX
	MOVQ tbl+32(FP), R8
	VMOVDQU nvfp4lut<>(SB), X7
	VMOVDQU nvfp4mask<>(SB), X8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1

loop2:
	CMPQ CX, $2
	JL   loop1
	BLOCK16(0, 0, 32, 0, Y4, Y5, Y6, Y9, Y0)
	BLOCK16(8, 64, 96, 1, Y10, Y11, Y12, Y13, Y1)
	ADDQ $16, DI
	ADDQ $2, DX
	ADDQ $128, SI
	SUBQ $2, CX
	JMP  loop2

loop1:
	CMPQ CX, $0
	JE   reduce
	BLOCK16(0, 0, 32, 0, Y4, Y5, Y6, Y9, Y0)

reduce:
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+40(FP)
	RET

// func dot4AVX2(w *float32, stride int, x *float32, n int, out *[4]float32)
// out[j] = Σ_{i<n} w[j*stride+i] * x[i] for j < 4; n is a multiple of 8,
// stride is in floats.
TEXT ·dot4AVX2(SB), NOSPLIT, $0-40
	MOVQ w+0(FP), DI
	MOVQ stride+8(FP), R9
	SHLQ $2, R9
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	MOVQ out+32(FP), R8
	LEAQ (R9)(R9*2), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

d4loop16:
	CMPQ CX, $16
	JL   d4loop8
	VMOVUPS (SI), Y8
	VMOVUPS 32(SI), Y9
	VFMADD231PS (DI), Y8, Y0
	VFMADD231PS (DI)(R9*1), Y8, Y1
	VFMADD231PS (DI)(R9*2), Y8, Y2
	VFMADD231PS (DI)(R10*1), Y8, Y3
	VFMADD231PS 32(DI), Y9, Y4
	VFMADD231PS 32(DI)(R9*1), Y9, Y5
	VFMADD231PS 32(DI)(R9*2), Y9, Y6
	VFMADD231PS 32(DI)(R10*1), Y9, Y7
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  d4loop16

d4loop8:
	CMPQ CX, $8
	JL   d4reduce
	VMOVUPS (SI), Y8
	VFMADD231PS (DI), Y8, Y0
	VFMADD231PS (DI)(R9*1), Y8, Y1
	VFMADD231PS (DI)(R9*2), Y8, Y2
	VFMADD231PS (DI)(R10*1), Y8, Y3

d4reduce:
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	// Horizontal sums of Y0..Y3 into one vector [s0 s1 s2 s3].
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, (R8)
	VZEROUPPER
	RET
