#include "textflag.h"

// ROPE8(off, QA, QB, KA, KB, P, M, C, S): the 8 pairs at off: QA QB KA KB
// loaded from qa (AX), qb (BX), ka (CX), kb (DX); P = qa·ka + qb·kb and
// M = qb·ka − qa·kb, C += cos·P (cos at SI), S += sin·M (sin at DI).
#define ROPE8(off, QA, QB, KA, KB, P, M, C, S) \
	VMOVUPS off(AX), QA; \
	VMOVUPS off(BX), QB; \
	VMOVUPS off(CX), KA; \
	VMOVUPS off(DX), KB; \
	VMULPS  KA, QA, P; \
	VFMADD231PS KB, QB, P; \
	VFMADD231PS off(SI), P, C; \
	VMULPS  KA, QB, M; \
	VFNMADD231PS KB, QA, M; \
	VFMADD231PS off(DI), M, S

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
	ROPE8(0, Y2, Y3, Y4, Y5, Y6, Y7, Y0, Y1)
	ROPE8(32, Y10, Y11, Y12, Y13, Y14, Y15, Y8, Y9)
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
	ROPE8(0, Y2, Y3, Y4, Y5, Y6, Y7, Y0, Y1)

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
