#include "textflag.h"

// DOTARGS: SI x, DI w, CX n; the accumulators Y0-Y3 zeroed.
#define DOTARGS \
	MOVQ x+0(FP), SI; \
	MOVQ w+8(FP), DI; \
	MOVQ n+16(FP), CX; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3

// FMA4(P): Y0..Y3 += Y4..Y7 times the 32 floats at (P).
#define FMA4(P) \
	VFMADD231PS (P), Y4, Y0; \
	VFMADD231PS 32(P), Y5, Y1; \
	VFMADD231PS 64(P), Y6, Y2; \
	VFMADD231PS 96(P), Y7, Y3

// HSUM4: Y0 + Y1 + Y2 + Y3, all lanes, into X0 (the low lane).
#define HSUM4 \
	VADDPS Y1, Y0, Y0; \
	VADDPS Y3, Y2, Y2; \
	VADDPS Y2, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VHADDPS X0, X0, X0; \
	VHADDPS X0, X0, X0

// func dotF32AVX2(x, w *float32, n int) float32
// Σ x[i]·w[i] with four 8-wide FMA accumulators (32 floats a step).
TEXT ·dotF32AVX2(SB), NOSPLIT, $0-28
	DOTARGS

f32loop32:
	CMPQ CX, $32
	JL   f32loop8
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	FMA4(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  f32loop32

f32loop8:
	CMPQ CX, $8
	JL   f32reduce
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  f32loop8

f32reduce:
	HSUM4

f32tail:
	CMPQ CX, $0
	JE   f32done
	VMOVSS (SI), X4
	VFMADD231SS (DI), X4, X0
	ADDQ $4, SI
	ADDQ $4, DI
	DECQ CX
	JMP  f32tail

f32done:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotBF16AVX2(x *float32, w *uint16, n int) float32
// Σ x[i]·bf16(w[i]): each bf16 is widened to float32 by a 16-bit left shift.
TEXT ·dotBF16AVX2(SB), NOSPLIT, $0-28
	DOTARGS

bfloop32:
	CMPQ CX, $32
	JL   bfloop8
	VPMOVZXWD (DI), Y4
	VPMOVZXWD 16(DI), Y5
	VPMOVZXWD 32(DI), Y6
	VPMOVZXWD 48(DI), Y7
	VPSLLD $16, Y4, Y4
	VPSLLD $16, Y5, Y5
	VPSLLD $16, Y6, Y6
	VPSLLD $16, Y7, Y7
	FMA4(SI)
	ADDQ $128, SI
	ADDQ $64, DI
	SUBQ $32, CX
	JMP  bfloop32

bfloop8:
	CMPQ CX, $8
	JL   bfreduce
	VPMOVZXWD (DI), Y4
	VPSLLD $16, Y4, Y4
	VFMADD231PS (SI), Y4, Y0
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JMP  bfloop8

bfreduce:
	HSUM4

bftail:
	CMPQ CX, $0
	JE   bfdone
	MOVWLZX (DI), AX
	SHLL $16, AX
	MOVL AX, X4
	VFMADD231SS (SI), X4, X0
	ADDQ $4, SI
	ADDQ $2, DI
	DECQ CX
	JMP  bftail

bfdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET
