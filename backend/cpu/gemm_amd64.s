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

// The AVX-512 versions (hasAVX512): 16 lanes a register, the same tiles;
// each accumulator's two 8-lane halves are added before the store, so the
// caller sees the AVX2 kernels' 8 partial sums.

// WIDEN16(addr, Z): 16 bf16 at addr as float32 in Z.
#define WIDEN16(addr, Z) VPMOVZXWD addr, Z; VPSLLD $16, Z, Z

// FMA3Z(w, r0, r1, r2): the weight row in w times the 3 tokens' x (Z12-Z14).
#define FMA3Z(w, r0, r1, r2) VFMADD231PS Z12, w, r0; VFMADD231PS Z13, w, r1; VFMADD231PS Z14, w, r2

// HALVES(Z, Y, off): Y (Z's low half) += Z's high half, stored at off(AX).
#define HALVES(Z, Y, off) VEXTRACTF64X4 $1, Z, Y16; VADDPS Y16, Y, Y; VMOVUPS Y, off(AX)

// func dot4x3BF16AVX512(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)
// dot4x3BF16AVX2 with 16 values of k a step; k is a multiple of 16.
TEXT ·dot4x3BF16AVX512(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $1, R8; LEAQ (R8)(R8*2), R9
	MOVQ x+16(FP), SI; MOVQ ldx+24(FP), R10; SHLQ $2, R10; MOVQ k+32(FP), CX; MOVQ out+40(FP), AX
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11

z43loop:
	TESTQ CX, CX
	JE    z43done
	VMOVUPS (SI), Z12; VMOVUPS (SI)(R10*1), Z13; VMOVUPS (SI)(R10*2), Z14
	WIDEN16((DI), Z15); FMA3Z(Z15, Z0, Z1, Z2)
	WIDEN16((DI)(R8*1), Z17); FMA3Z(Z17, Z3, Z4, Z5)
	WIDEN16((DI)(R8*2), Z18); FMA3Z(Z18, Z6, Z7, Z8)
	WIDEN16((DI)(R9*1), Z19); FMA3Z(Z19, Z9, Z10, Z11)
	ADDQ $32, DI; ADDQ $64, SI; SUBQ $16, CX
	JMP  z43loop

z43done:
	HALVES(Z0, Y0, 0); HALVES(Z1, Y1, 32); HALVES(Z2, Y2, 64); HALVES(Z3, Y3, 96)
	HALVES(Z4, Y4, 128); HALVES(Z5, Y5, 160); HALVES(Z6, Y6, 192); HALVES(Z7, Y7, 224)
	HALVES(Z8, Y8, 256); HALVES(Z9, Y9, 288); HALVES(Z10, Y10, 320); HALVES(Z11, Y11, 352)
	VZEROUPPER
	RET

// TWOZ(B, a0, b0, a1, b1): rows B and B+R8 (32 bf16 each, widened) times x
// (Z12, Z13) into their two accumulators each.
#define TWOZ(B, a0, b0, a1, b1) \
	WIDEN16((B), Z8); WIDEN16(32(B), Z9); WIDEN16((B)(R8*1), Z10); WIDEN16(32(B)(R8*1), Z11); \
	VFMADD231PS Z12, Z8, a0; VFMADD231PS Z13, Z9, b0; VFMADD231PS Z12, Z10, a1; VFMADD231PS Z13, Z11, b1

// func dot4BF16AVX512(w *uint16, ldw int, x *float32, k int, out *[32]float32)
// dot4BF16AVX2 with 32 values of k a step; k is a multiple of 32.
TEXT ·dot4BF16AVX512(SB), NOSPLIT, $0-40
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $1, R8; LEAQ (DI)(R8*2), BX
	MOVQ x+16(FP), SI; MOVQ k+24(FP), CX; MOVQ out+32(FP), AX
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7

z41loop:
	TESTQ CX, CX
	JE    z41done
	VMOVUPS (SI), Z12
	VMOVUPS 64(SI), Z13
	TWOZ(DI, Z0, Z4, Z1, Z5)
	TWOZ(BX, Z2, Z6, Z3, Z7)
	ADDQ $64, DI
	ADDQ $64, BX
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  z41loop

z41done:
	VADDPS Z4, Z0, Z0; VADDPS Z5, Z1, Z1; VADDPS Z6, Z2, Z2; VADDPS Z7, Z3, Z3
	HALVES(Z0, Y0, 0); HALVES(Z1, Y1, 32); HALVES(Z2, Y2, 64); HALVES(Z3, Y3, 96)
	VZEROUPPER
	RET
