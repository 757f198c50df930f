#include "textflag.h"

// ZERO4(a, b, c, d) zeroes four vector registers.
#define ZERO4(a, b, c, d) VXORPS a, a, a; VXORPS b, b, b; VXORPS c, c, c; VXORPS d, d, d

// WIDEN(addr, Y): 8 bf16 at addr as float32 in Y.
#define WIDEN(addr, Y) VPMOVZXWD addr, Y; VPSLLD $16, Y, Y

// FMA3(r0, r1, r2): the weight row in Y15 times the 3 tokens' x (Y12-Y14)
// into that row's 3 accumulators.
#define FMA3(r0, r1, r2) VFMADD231PS Y12, Y15, r0; VFMADD231PS Y13, Y15, r1; VFMADD231PS Y14, Y15, r2

// The 4x3 kernels: DI the 4 weight rows (R8 bytes apart, R9 = 3 rows), SI
// the 3 tokens' x (R10 bytes apart), CX the count of k left, AX out; Y0-Y11
// the accumulators (row r, token t in Y(3r+t)). SHIFT is log2 of the weight
// size, LOADW(addr) loads 8 weights as float32 into Y15 (defined before
// each kernel), STEP the bytes of 8 weights.
#define KERNEL43(SHIFT, STEP, loop, done) \
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $SHIFT, R8; LEAQ (R8)(R8*2), R9; \
	MOVQ x+16(FP), SI; MOVQ ldx+24(FP), R10; SHLQ $2, R10; MOVQ k+32(FP), CX; MOVQ out+40(FP), AX; \
	ZERO4(Y0, Y1, Y2, Y3); ZERO4(Y4, Y5, Y6, Y7); ZERO4(Y8, Y9, Y10, Y11); \
loop: \
	TESTQ CX, CX; JE done; \
	VMOVUPS (SI), Y12; VMOVUPS (SI)(R10*1), Y13; VMOVUPS (SI)(R10*2), Y14; \
	LOADW((DI)); FMA3(Y0, Y1, Y2); \
	LOADW((DI)(R8*1)); FMA3(Y3, Y4, Y5); \
	LOADW((DI)(R8*2)); FMA3(Y6, Y7, Y8); \
	LOADW((DI)(R9*1)); FMA3(Y9, Y10, Y11); \
	ADDQ $STEP, DI; ADDQ $32, SI; SUBQ $8, CX; JMP loop; \
done: \
	VMOVUPS Y0, (AX); VMOVUPS Y1, 32(AX); VMOVUPS Y2, 64(AX); VMOVUPS Y3, 96(AX); \
	VMOVUPS Y4, 128(AX); VMOVUPS Y5, 160(AX); VMOVUPS Y6, 192(AX); VMOVUPS Y7, 224(AX); \
	VMOVUPS Y8, 256(AX); VMOVUPS Y9, 288(AX); VMOVUPS Y10, 320(AX); VMOVUPS Y11, 352(AX); \
	VZEROUPPER; RET

#define LOADW(addr) WIDEN(addr, Y15)

// func dot4x3BF16AVX2(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)
// The 8-lane partial sums of Σ_p w[r*ldw+p] * x[t*ldx+p] for 4 bf16 weight
// rows r and 3 tokens t, in out[(3r+t)*8:]; k is a multiple of 8. Each row
// chunk is widened once and serves the 3 tokens.
TEXT ·dot4x3BF16AVX2(SB), NOSPLIT, $0-48
	KERNEL43(1, 16, b43loop, b43done)

#undef LOADW
#define LOADW(addr) VMOVUPS addr, Y15

// func dot4x3F32AVX2(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)
// dot4x3BF16AVX2 for float32 weights.
TEXT ·dot4x3F32AVX2(SB), NOSPLIT, $0-48
	KERNEL43(2, 32, f43loop, f43done)

// TWO(B, a0, b0, a1, b1): rows B and B+R8 (16 bf16 each, widened) times x
// (Y12, Y13) into their two accumulators each.
#define TWO(B, a0, b0, a1, b1) \
	WIDEN((B), Y8); WIDEN(16(B), Y9); WIDEN((B)(R8*1), Y10); WIDEN(16(B)(R8*1), Y11); \
	VFMADD231PS Y12, Y8, a0; VFMADD231PS Y13, Y9, b0; VFMADD231PS Y12, Y10, a1; VFMADD231PS Y13, Y11, b1

// func dot4BF16AVX2(w *uint16, ldw int, x *float32, k int, out *[32]float32)
// The decode matvec's tile: the 8-lane partial sums of 4 bf16 weight rows
// (ldw apart) with one x, 16 values of k a step (two accumulators a row);
// k is a multiple of 16. out[8r:] holds row r's partial sums.
TEXT ·dot4BF16AVX2(SB), NOSPLIT, $0-40
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $1, R8; LEAQ (DI)(R8*2), BX
	MOVQ x+16(FP), SI; MOVQ k+24(FP), CX; MOVQ out+32(FP), AX
	ZERO4(Y0, Y1, Y2, Y3)
	ZERO4(Y4, Y5, Y6, Y7)

b41loop:
	TESTQ CX, CX
	JE    b41done
	VMOVUPS (SI), Y12
	VMOVUPS 32(SI), Y13
	TWO(DI, Y0, Y4, Y1, Y5)
	TWO(BX, Y2, Y6, Y3, Y7)
	ADDQ $32, DI
	ADDQ $32, BX
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  b41loop

b41done:
	VADDPS Y4, Y0, Y0; VADDPS Y5, Y1, Y1; VADDPS Y6, Y2, Y2; VADDPS Y7, Y3, Y3
	VMOVUPS Y0, (AX); VMOVUPS Y1, 32(AX); VMOVUPS Y2, 64(AX); VMOVUPS Y3, 96(AX)
	VZEROUPPER
	RET
