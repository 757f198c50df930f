#include "textflag.h"

// FMA3(r0, r1, r2): the weight row in Y15 times the 3 tokens' x (Y12-Y14)
// into that row's 3 accumulators.
#define FMA3(r0, r1, r2) \
	VFMADD231PS Y12, Y15, r0; \
	VFMADD231PS Y13, Y15, r1; \
	VFMADD231PS Y14, Y15, r2

// Register use of the 4x3 kernels: DI the 4 weight rows (R8 apart, R9 = 3
// rows), SI the 3 tokens' x (R10 apart), CX the count of k left, AX out;
// Y0-Y11 the accumulators (row r, token t in Y(3r+t)).
#define PROLOGUE \
	MOVQ w+0(FP), DI; \
	MOVQ ldw+8(FP), R8; \
	MOVQ x+16(FP), SI; \
	MOVQ ldx+24(FP), R10; \
	SHLQ $2, R10; \
	MOVQ k+32(FP), CX; \
	MOVQ out+40(FP), AX; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; \
	VXORPS Y9, Y9, Y9; \
	VXORPS Y10, Y10, Y10; \
	VXORPS Y11, Y11, Y11

#define LOADX \
	VMOVUPS (SI), Y12; \
	VMOVUPS (SI)(R10*1), Y13; \
	VMOVUPS (SI)(R10*2), Y14

#define EPILOGUE \
	VMOVUPS Y0, (AX); \
	VMOVUPS Y1, 32(AX); \
	VMOVUPS Y2, 64(AX); \
	VMOVUPS Y3, 96(AX); \
	VMOVUPS Y4, 128(AX); \
	VMOVUPS Y5, 160(AX); \
	VMOVUPS Y6, 192(AX); \
	VMOVUPS Y7, 224(AX); \
	VMOVUPS Y8, 256(AX); \
	VMOVUPS Y9, 288(AX); \
	VMOVUPS Y10, 320(AX); \
	VMOVUPS Y11, 352(AX); \
	VZEROUPPER; \
	RET

// func dot4x3BF16AVX2(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)
// The 8-lane partial sums of Σ_p w[r*ldw+p] * x[t*ldx+p] for 4 bf16 weight
// rows r and 3 tokens t, in out[(3r+t)*8:]; k is a multiple of 8. Each row
// chunk is widened once and serves the 3 tokens.
TEXT ·dot4x3BF16AVX2(SB), NOSPLIT, $0-48
	PROLOGUE
	SHLQ $1, R8
	LEAQ (R8)(R8*2), R9

b43loop:
	TESTQ CX, CX
	JE    b43done
	LOADX
	VPMOVZXWD (DI), Y15
	VPSLLD $16, Y15, Y15
	FMA3(Y0, Y1, Y2)
	VPMOVZXWD (DI)(R8*1), Y15
	VPSLLD $16, Y15, Y15
	FMA3(Y3, Y4, Y5)
	VPMOVZXWD (DI)(R8*2), Y15
	VPSLLD $16, Y15, Y15
	FMA3(Y6, Y7, Y8)
	VPMOVZXWD (DI)(R9*1), Y15
	VPSLLD $16, Y15, Y15
	FMA3(Y9, Y10, Y11)
	ADDQ $16, DI
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  b43loop

b43done:
	EPILOGUE

// func dot4x3F32AVX2(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)
// dot4x3BF16AVX2 for float32 weights.
TEXT ·dot4x3F32AVX2(SB), NOSPLIT, $0-48
	PROLOGUE
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R9

f43loop:
	TESTQ CX, CX
	JE    f43done
	LOADX
	VMOVUPS (DI), Y15
	FMA3(Y0, Y1, Y2)
	VMOVUPS (DI)(R8*1), Y15
	FMA3(Y3, Y4, Y5)
	VMOVUPS (DI)(R8*2), Y15
	FMA3(Y6, Y7, Y8)
	VMOVUPS (DI)(R9*1), Y15
	FMA3(Y9, Y10, Y11)
	ADDQ $32, DI
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  f43loop

f43done:
	EPILOGUE

// WIDEN(addr, Y): 8 bf16 at addr as float32 in Y.
#define WIDEN(addr, Y) \
	VPMOVZXWD addr, Y; \
	VPSLLD $16, Y, Y

// func dot4BF16AVX2(w *uint16, ldw int, x *float32, k int, out *[32]float32)
// The decode matvec's tile: the 8-lane partial sums of 4 bf16 weight rows
// (ldw apart) with one x, 16 values of k a step (two accumulators a row);
// k is a multiple of 16. out[8r:] holds row r's partial sums.
TEXT ·dot4BF16AVX2(SB), NOSPLIT, $0-40
	MOVQ w+0(FP), DI
	MOVQ ldw+8(FP), R8
	SHLQ $1, R8
	LEAQ (R8)(R8*2), R9
	MOVQ x+16(FP), SI
	MOVQ k+24(FP), CX
	MOVQ out+32(FP), AX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

b41loop:
	TESTQ CX, CX
	JE    b41done
	VMOVUPS (SI), Y12
	VMOVUPS 32(SI), Y13
	WIDEN((DI), Y8)
	WIDEN(16(DI), Y9)
	WIDEN((DI)(R8*1), Y10)
	WIDEN(16(DI)(R8*1), Y11)
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y13, Y9, Y4
	VFMADD231PS Y12, Y10, Y1
	VFMADD231PS Y13, Y11, Y5
	WIDEN((DI)(R8*2), Y8)
	WIDEN(16(DI)(R8*2), Y9)
	WIDEN((DI)(R9*1), Y10)
	WIDEN(16(DI)(R9*1), Y11)
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y13, Y9, Y6
	VFMADD231PS Y12, Y10, Y3
	VFMADD231PS Y13, Y11, Y7
	ADDQ $32, DI
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  b41loop

b41done:
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	VMOVUPS Y0, (AX)
	VMOVUPS Y1, 32(AX)
	VMOVUPS Y2, 64(AX)
	VMOVUPS Y3, 96(AX)
	VZEROUPPER
	RET
