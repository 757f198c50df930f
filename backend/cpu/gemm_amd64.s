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

// DOT4(ZERO, TWOM, VB, A0..A7, X0, X1, loop, done): the matvec tile's
// body for vectors of VB bytes (registers A0-A7 the accumulators, X0 X1
// x; TWOM the widen-and-multiply of two rows, ZERO4 or ZERO4Z): 4 rows, 2
// vectors of x a step, each row's two accumulators added into A0-A3.
#define DOT4(ZERO, TWOM, VB, A0, A1, A2, A3, A4, A5, A6, A7, X0, X1, loop, done) \
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $1, R8; LEAQ (DI)(R8*2), BX; \
	MOVQ x+16(FP), SI; MOVQ k+24(FP), CX; MOVQ out+32(FP), AX; \
	ZERO(A0, A1, A2, A3); ZERO(A4, A5, A6, A7); \
loop: \
	TESTQ CX, CX; JE done; \
	VMOVUPS (SI), X0; VMOVUPS VB(SI), X1; \
	TWOM(DI, A0, A4, A1, A5); TWOM(BX, A2, A6, A3, A7); \
	ADDQ $VB, DI; ADDQ $VB, BX; ADDQ $(2*VB), SI; SUBQ $(VB/2), CX; JMP loop; \
done: \
	VADDPS A4, A0, A0; VADDPS A5, A1, A1; VADDPS A6, A2, A2; VADDPS A7, A3, A3

#define LOADW(addr) WIDEN(addr, Y15)

// func dot4x3BF16(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)
// The 8-lane partial sums of Σ_p w[r*ldw+p] * x[t*ldx+p] for 4 bf16 weight
// rows r and 3 tokens t, in out[(3r+t)*8:]; k is a multiple of 8. Each row
// chunk is widened once and serves the 3 tokens.
TEXT ·dot4x3BF16(SB), NOSPLIT, $0-48
	KERNEL43(1, 16, b43loop, b43done)

#undef LOADW
#define LOADW(addr) VMOVUPS addr, Y15

// func dot4x3F32(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)
// dot4x3BF16 for float32 weights.
TEXT ·dot4x3F32(SB), NOSPLIT, $0-48
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
	DOT4(ZERO4, TWO, 32, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7, Y12, Y13, b41loop, b41done)
	VMOVUPS Y0, (AX); VMOVUPS Y1, 32(AX); VMOVUPS Y2, 64(AX); VMOVUPS Y3, 96(AX)
	VZEROUPPER
	RET

// The AVX-512 version of the matvec tile (hasAVX512): 16 lanes a register;
// each accumulator's two 8-lane halves are added before the store, so the
// caller sees the AVX2 kernel's 8 partial sums.

// WIDEN16(addr, Z): 16 bf16 at addr as float32 in Z.
#define WIDEN16(addr, Z) VPMOVZXWD addr, Z; VPSLLD $16, Z, Z

// HALVES(Z, Y, off): Y (Z's low half) += Z's high half, stored at off(AX).
#define HALVES(Z, Y, off) VEXTRACTF64X4 $1, Z, Y16; VADDPS Y16, Y, Y; VMOVUPS Y, off(AX)

// TWOZ(B, a0, b0, a1, b1): rows B and B+R8 (32 bf16 each, widened) times x
// (Z12, Z13) into their two accumulators each.
#define TWOZ(B, a0, b0, a1, b1) \
	WIDEN16((B), Z8); WIDEN16(32(B), Z9); WIDEN16((B)(R8*1), Z10); WIDEN16(32(B)(R8*1), Z11); \
	VFMADD231PS Z12, Z8, a0; VFMADD231PS Z13, Z9, b0; VFMADD231PS Z12, Z10, a1; VFMADD231PS Z13, Z11, b1

// ZERO4Z(a, b, c, d) zeroes four 16-lane registers.
#define ZERO4Z(a, b, c, d) VPXORD a, a, a; VPXORD b, b, b; VPXORD c, c, c; VPXORD d, d, d

// func dot4BF16AVX512(w *uint16, ldw int, x *float32, k int, out *[32]float32)
// dot4BF16AVX2 with 32 values of k a step; k is a multiple of 32.
TEXT ·dot4BF16AVX512(SB), NOSPLIT, $0-40
	DOT4(ZERO4Z, TWOZ, 64, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z12, Z13, z41loop, z41done)
	HALVES(Z0, Y0, 0); HALVES(Z1, Y1, 32); HALVES(Z2, Y2, 64); HALVES(Z3, Y3, 96)
	VZEROUPPER
	RET

// The 4x6 prefill kernel (gemmWide): 4 bf16 weight rows by 6 tokens in
// Z0-Z23 (row r, token t in Z(6r+t)), 32 values of k a step. A step loads
// 32 bf16 of a row as one vector: VPSLLD $16 widens its even elements and
// VPANDD with 0xFFFF0000 (Z31) its odd ones, one instruction for 16
// weights; the tokens' x are packed to match (packWide: 16 even values,
// then 16 odd). Z24-Z29 hold the 6 tokens' even (then odd) halves, Z30 the
// widened row.

// FMA6(w, a, b, c, d, e, f): the widened row w times the 6 tokens' x.
#define FMA6(w, a, b, c, d, e, f) \
	VFMADD231PS Z24, w, a; VFMADD231PS Z25, w, b; VFMADD231PS Z26, w, c; \
	VFMADD231PS Z27, w, d; VFMADD231PS Z28, w, e; VFMADD231PS Z29, w, f

// LOADX(off): the 6 tokens' 16 values at off(SI) (128 bytes apart).
#define LOADX(off) \
	VMOVUPS off(SI), Z24; VMOVUPS off+128(SI), Z25; VMOVUPS off+256(SI), Z26; \
	VMOVUPS off+384(SI), Z27; VMOVUPS off+512(SI), Z28; VMOVUPS off+640(SI), Z29

// ROWS(OP): the 4 rows' halves widened by OP(addr) into Z30, each times x.
#define ROWS(OP) \
	OP((DI)); FMA6(Z30, Z0, Z1, Z2, Z3, Z4, Z5); \
	OP((DI)(R8*1)); FMA6(Z30, Z6, Z7, Z8, Z9, Z10, Z11); \
	OP((DI)(R8*2)); FMA6(Z30, Z12, Z13, Z14, Z15, Z16, Z17); \
	OP((DI)(R9*1)); FMA6(Z30, Z18, Z19, Z20, Z21, Z22, Z23)

#define EVEN(addr) VPSLLD $16, addr, Z30
#define ODD(addr) VPANDD addr, Z31, Z30

// LANES4(a, b, c, d, dst, t): dst's 128-bit lane j holds 4 partial sums
// whose total is the sum of all 16 lanes of input j (a, b, c clobbered).
#define LANES4(a, b, c, d, dst, t) \
	VSHUFF32X4 $0x44, b, a, t; VSHUFF32X4 $0xEE, b, a, a; VADDPS t, a, a; \
	VSHUFF32X4 $0x44, d, c, t; VSHUFF32X4 $0xEE, d, c, c; VADDPS t, c, c; \
	VSHUFF32X4 $0x88, c, a, t; VSHUFF32X4 $0xDD, c, a, dst; VADDPS t, dst, dst

// SUMS4(a, b, c, d, dst, t1, t2): from 4 rows' LANES4 results, dst's lane j
// holds the 4 rows' sums for token j.
#define SUMS4(a, b, c, d, dst, t1, t2) \
	VUNPCKLPS b, a, t1; VUNPCKHPS b, a, t2; VADDPS t2, t1, t1; \
	VUNPCKLPS d, c, t2; VUNPCKHPS d, c, dst; VADDPS dst, t2, t2; \
	VSHUFPS $0x44, t2, t1, dst; VSHUFPS $0xEE, t2, t1, t1; VADDPS t1, dst, dst

// ADDOUT(X): out at DX += X (the 4 rows of a token, through X30: a write
// to X28 would clear the rest of Z28); then DX moves to the next token and
// BX counts the tokens down, leaving at wdone at 0.
#define ADDOUT(X) \
	VADDPS (DX), X, X30; VMOVUPS X30, (DX); ADDQ R10, DX; DECQ BX; JEQ wdone

// func gemm4x6BF16AVX512(w *uint16, ldw int, x *float32, steps int, out *float32, ldo int, nt int, pf *uint16)
// out[t*ldo + r] += Σ_p w[r*ldw+p] * x_t[p] for the 4 rows r and the first
// nt (1 to 6) of 6 tokens t, over steps*32 values of k; x is the 6 tokens'
// packed values, 32 a token a step (packWide). A cache line from pf on is
// prefetched into L2 each step.
TEXT ·gemm4x6BF16AVX512(SB), NOSPLIT, $0-64
	MOVQ w+0(FP), DI; MOVQ ldw+8(FP), R8; SHLQ $1, R8; LEAQ (R8)(R8*2), R9
	MOVQ x+16(FP), SI; MOVQ steps+24(FP), CX; MOVQ pf+56(FP), R11
	MOVL $0xFFFF0000, AX; VPBROADCASTD AX, Z31
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20; VPXORD Z21, Z21, Z21; VPXORD Z22, Z22, Z22; VPXORD Z23, Z23, Z23
	TESTQ CX, CX
	JE    wsum

wloop:
	PREFETCHT1 (R11)
	LOADX(0)
	ROWS(EVEN)
	LOADX(64)
	ROWS(ODD)
	ADDQ $64, DI
	ADDQ $768, SI
	ADDQ $64, R11
	DECQ CX
	JNE  wloop

wsum:
	// Tokens 0-3: each row's 4 accumulators to lanes, then the rows' sums.
	LANES4(Z0, Z1, Z2, Z3, Z24, Z30)
	LANES4(Z6, Z7, Z8, Z9, Z25, Z30)
	LANES4(Z12, Z13, Z14, Z15, Z26, Z30)
	LANES4(Z18, Z19, Z20, Z21, Z27, Z30)
	SUMS4(Z24, Z25, Z26, Z27, Z28, Z29, Z30)
	// Tokens 4-5 (lanes 2 and 3 zero).
	VPXORD Z31, Z31, Z31
	LANES4(Z4, Z5, Z31, Z31, Z24, Z30)
	VPXORD Z31, Z31, Z31
	LANES4(Z10, Z11, Z31, Z31, Z25, Z30)
	VPXORD Z31, Z31, Z31
	LANES4(Z16, Z17, Z31, Z31, Z26, Z30)
	VPXORD Z31, Z31, Z31
	LANES4(Z22, Z23, Z31, Z31, Z27, Z30)
	SUMS4(Z24, Z25, Z26, Z27, Z29, Z30, Z31)
	MOVQ out+32(FP), DX; MOVQ ldo+40(FP), R10; SHLQ $2, R10; MOVQ nt+48(FP), BX
	ADDOUT(X28)
	VEXTRACTF32X4 $1, Z28, X31
	ADDOUT(X31)
	VEXTRACTF32X4 $2, Z28, X31
	ADDOUT(X31)
	VEXTRACTF32X4 $3, Z28, X31
	ADDOUT(X31)
	ADDOUT(X29)
	VEXTRACTF32X4 $1, Z29, X31
	ADDOUT(X31)

wdone:
	VZEROUPPER
	RET

// The even and odd indices into two vectors of 16 (VPERMT2PS).
DATA wideEven<>+0(SB)/8, $0x0000000200000000
DATA wideEven<>+8(SB)/8, $0x0000000600000004
DATA wideEven<>+16(SB)/8, $0x0000000a00000008
DATA wideEven<>+24(SB)/8, $0x0000000e0000000c
DATA wideEven<>+32(SB)/8, $0x0000001200000010
DATA wideEven<>+40(SB)/8, $0x0000001600000014
DATA wideEven<>+48(SB)/8, $0x0000001a00000018
DATA wideEven<>+56(SB)/8, $0x0000001e0000001c
GLOBL wideEven<>(SB), RODATA|NOPTR, $64

// func packWideAVX512(dst *float32, src *float32, steps int)
// packWide for one token: for each step s, the 16 even then the 16 odd of
// src[32s:32s+32] at dst[192s:].
TEXT ·packWideAVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI; MOVQ src+8(FP), SI; MOVQ steps+16(FP), CX
	VMOVDQU32 wideEven<>(SB), Z30
	MOVL $1, AX; VPBROADCASTD AX, Z31; VPADDD Z31, Z30, Z31
	TESTQ CX, CX
	JE    pdone

ploop:
	VMOVUPS (SI), Z0; VMOVUPS (SI), Z1
	VPERMT2PS 64(SI), Z30, Z0; VPERMT2PS 64(SI), Z31, Z1
	VMOVUPS Z0, (DI); VMOVUPS Z1, 64(DI)
	ADDQ $128, SI; ADDQ $768, DI
	DECQ CX
	JNE  ploop

pdone:
	VZEROUPPER
	RET

// SUM4(a, b, c, d, X): X = the totals of the 8 lanes of a, b, c and d, in
// that order, each added as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); Y13, Y14
// clobbered, a and c too.
#define SUM4(a, b, c, d, Y, X) \
	VHADDPS b, a, a; VHADDPS d, c, c; VHADDPS c, a, Y; \
	VEXTRACTF128 $1, Y, X14; VADDPS X14, X, X

// The AVX2 bf16 prefill (gemmPacked): a quad of rows widened once per pass
// of k into float32, 8 values of each of the 4 rows a step (widen4BF16),
// then 4 rows x 3 tokens a tile over the tokens' x packed likewise, 8
// values of each of the 3 a step: every operand a contiguous stream from
// L1, and the FMA pipes doing nothing but FMAs.

// func widen4BF16(dst *float32, w *uint16, ldw int, steps int, pf *uint16)
// dst[32s + 8r + j] = w[r*ldw + 8s + j] as float32, for the 4 rows r and
// the steps s; meanwhile the same span of the 4 rows from pf on (the next
// quad's) is prefetched, so that it waits in cache when its turn comes.
TEXT ·widen4BF16(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI; MOVQ w+8(FP), SI; MOVQ ldw+16(FP), R8; SHLQ $1, R8; LEAQ (R8)(R8*2), R9
	MOVQ steps+24(FP), CX; MOVQ pf+32(FP), R11
	TESTQ CX, CX
	JE    w4done
w4loop:
	PREFETCHT0 (R11); PREFETCHT0 (R11)(R8*1); PREFETCHT0 (R11)(R8*2); PREFETCHT0 (R11)(R9*1)
	WIDEN((SI), Y0); WIDEN((SI)(R8*1), Y1); WIDEN((SI)(R8*2), Y2); WIDEN((SI)(R9*1), Y3)
	VMOVUPS Y0, (DI); VMOVUPS Y1, 32(DI); VMOVUPS Y2, 64(DI); VMOVUPS Y3, 96(DI)
	ADDQ $16, SI
	ADDQ $16, R11
	ADDQ $128, DI
	DECQ CX
	JNE  w4loop
w4done:
	VZEROUPPER
	RET

// ADDOUTP(X): out at DX += X (the 4 rows of a token); then DX moves to the
// next token and BX counts the tokens down, leaving at pdone3 at 0.
#define ADDOUTP(X) \
	VADDPS (DX), X, X; VMOVUPS X, (DX); ADDQ R10, DX; DECQ BX; JEQ pdone3

// func gemm4x3F32P(w *float32, x *float32, steps int, out *float32, ldo int, nt int)
// out[t*ldo + r] += Σ_p w_r[p] * x_t[p] for the 4 rows r and the first nt
// (1 to 3) of 3 tokens t, over steps*8 values: w as widen4BF16 writes it,
// x the 3 tokens' 8 values a step.
TEXT ·gemm4x3F32P(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), DI; MOVQ x+8(FP), SI; MOVQ steps+16(FP), CX
	ZERO4(Y0, Y1, Y2, Y3); ZERO4(Y4, Y5, Y6, Y7); ZERO4(Y8, Y9, Y10, Y11)
	TESTQ CX, CX
	JE    psum3
ploop3:
	VMOVUPS (SI), Y12; VMOVUPS 32(SI), Y13; VMOVUPS 64(SI), Y14
	VMOVUPS (DI), Y15; FMA3(Y0, Y1, Y2)
	VMOVUPS 32(DI), Y15; FMA3(Y3, Y4, Y5)
	VMOVUPS 64(DI), Y15; FMA3(Y6, Y7, Y8)
	VMOVUPS 96(DI), Y15; FMA3(Y9, Y10, Y11)
	ADDQ $128, DI
	ADDQ $96, SI
	DECQ CX
	JNE  ploop3
psum3:
	MOVQ out+24(FP), DX; MOVQ ldo+32(FP), R10; SHLQ $2, R10; MOVQ nt+40(FP), BX
	SUM4(Y0, Y3, Y6, Y9, Y12, X12)
	ADDOUTP(X12)
	SUM4(Y1, Y4, Y7, Y10, Y12, X12)
	ADDOUTP(X12)
	SUM4(Y2, Y5, Y8, Y11, Y12, X12)
	ADDOUTP(X12)
pdone3:
	VZEROUPPER
	RET
