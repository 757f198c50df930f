#include "textflag.h"

// func ropeDotAVX2(qa, qb, ka, kb, cos, sin *float32, n int) float32
// Σ cos[j]·(qa[j]·ka[j] + qb[j]·kb[j]) + sin[j]·(qb[j]·ka[j] − qa[j]·kb[j])
// for n a multiple of 8: the key rotated by (cos, sin) dotted with a rotated
// query, 16 pairs a step with two sets of accumulators.
TEXT ·ropeDotAVX2(SB), NOSPLIT, $0-60
	MOVQ qa+0(FP), AX
	MOVQ qb+8(FP), BX
	MOVQ ka+16(FP), CX
	MOVQ kb+24(FP), DX
	MOVQ cos+32(FP), SI
	MOVQ sin+40(FP), DI
	MOVQ n+48(FP), R8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9

rope16:
	CMPQ R8, $16
	JL   rope8
	VMOVUPS (AX), Y2
	VMOVUPS (BX), Y3
	VMOVUPS (CX), Y4
	VMOVUPS (DX), Y5
	VMULPS  Y4, Y2, Y6
	VFMADD231PS Y5, Y3, Y6
	VFMADD231PS (SI), Y6, Y0
	VMULPS  Y4, Y3, Y7
	VFNMADD231PS Y5, Y2, Y7
	VFMADD231PS (DI), Y7, Y1
	VMOVUPS 32(AX), Y10
	VMOVUPS 32(BX), Y11
	VMOVUPS 32(CX), Y12
	VMOVUPS 32(DX), Y13
	VMULPS  Y12, Y10, Y14
	VFMADD231PS Y13, Y11, Y14
	VFMADD231PS 32(SI), Y14, Y8
	VMULPS  Y12, Y11, Y15
	VFNMADD231PS Y13, Y10, Y15
	VFMADD231PS 32(DI), Y15, Y9
	ADDQ $64, AX
	ADDQ $64, BX
	ADDQ $64, CX
	ADDQ $64, DX
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, R8
	JMP  rope16

rope8:
	CMPQ R8, $8
	JL   ropereduce
	VMOVUPS (AX), Y2
	VMOVUPS (BX), Y3
	VMOVUPS (CX), Y4
	VMOVUPS (DX), Y5
	VMULPS  Y4, Y2, Y6
	VFMADD231PS Y5, Y3, Y6
	VFMADD231PS (SI), Y6, Y0
	VMULPS  Y4, Y3, Y7
	VFNMADD231PS Y5, Y2, Y7
	VFMADD231PS (DI), Y7, Y1

ropereduce:
	VADDPS Y8, Y0, Y0
	VADDPS Y9, Y1, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+56(FP)
	RET
