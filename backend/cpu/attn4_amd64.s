#include "textflag.h"

// func scores4Kernel(q, k *float32, stride, n, hd int, scale float32, out *float32)
// out[4t+g] = scale * Σ_j q[g*hd+j]·k[t*stride+j] for the 4 query rows q
// (hd floats each, hd%16 == 0) and the n key rows k (stride floats apart).
TEXT ·scores4Kernel(SB), NOSPLIT, $0-56
	MOVQ q+0(FP), SI; MOVQ k+8(FP), DI; MOVQ stride+16(FP), R8; MOVQ n+24(FP), CX
	MOVQ hd+32(FP), R9; MOVQ out+48(FP), AX
	VBROADCASTSS scale+40(FP), X6
	SHLQ $2, R8
	LEAQ (SI)(R9*4), R10     // query 1
	LEAQ (R10)(R9*4), R11    // query 2
	LEAQ (R11)(R9*4), R12    // query 3

s4key:
	TESTQ CX, CX
	JE    s4done
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	XORQ  BX, BX             // byte offset in the row

s4col:
	VMOVUPS (DI)(BX*1), Y4
	VMOVUPS 32(DI)(BX*1), Y5
	VFMADD231PS (SI)(BX*1), Y4, Y0
	VFMADD231PS (R10)(BX*1), Y4, Y1
	VFMADD231PS (R11)(BX*1), Y4, Y2
	VFMADD231PS (R12)(BX*1), Y4, Y3
	VFMADD231PS 32(SI)(BX*1), Y5, Y0
	VFMADD231PS 32(R10)(BX*1), Y5, Y1
	VFMADD231PS 32(R11)(BX*1), Y5, Y2
	VFMADD231PS 32(R12)(BX*1), Y5, Y3
	ADDQ $64, BX
	MOVQ R9, DX
	SHLQ $2, DX
	CMPQ BX, DX
	JL   s4col

	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMULPS X6, X0, X0
	VMOVUPS X0, (AX)
	ADDQ $16, AX
	ADDQ R8, DI
	DECQ CX
	JMP  s4key

s4done:
	VZEROUPPER
	RET

// func values4Kernel(acc, w, v *float32, stride, n, hd int)
// acc[g*hd+j] = Σ_t w[4t+g]·v[t*stride+j] for the 4 rows g (hd%16 == 0),
// 16 columns at a time over all n value rows.
TEXT ·values4Kernel(SB), NOSPLIT, $0-48
	MOVQ acc+0(FP), AX; MOVQ w+8(FP), SI; MOVQ v+16(FP), DI; MOVQ stride+24(FP), R8
	MOVQ n+32(FP), R9; MOVQ hd+40(FP), R10
	SHLQ $2, R8
	SHLQ $2, R10             // row bytes
	XORQ BX, BX              // column byte offset

v4chunk:
	CMPQ BX, R10
	JGE  v4done
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7
	MOVQ SI, R11
	LEAQ (DI)(BX*1), R12
	MOVQ R9, CX

v4row:
	TESTQ CX, CX
	JE    v4store
	VMOVUPS (R12), Y8
	VMOVUPS 32(R12), Y9
	VBROADCASTSS (R11), Y10
	VBROADCASTSS 4(R11), Y11
	VBROADCASTSS 8(R11), Y12
	VBROADCASTSS 12(R11), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y1
	VFMADD231PS Y11, Y8, Y2
	VFMADD231PS Y11, Y9, Y3
	VFMADD231PS Y12, Y8, Y4
	VFMADD231PS Y12, Y9, Y5
	VFMADD231PS Y13, Y8, Y6
	VFMADD231PS Y13, Y9, Y7
	ADDQ $16, R11
	ADDQ R8, R12
	DECQ CX
	JMP  v4row

v4store:
	LEAQ (AX)(BX*1), R12
	VMOVUPS Y0, (R12)
	VMOVUPS Y1, 32(R12)
	ADDQ R10, R12
	VMOVUPS Y2, (R12)
	VMOVUPS Y3, 32(R12)
	ADDQ R10, R12
	VMOVUPS Y4, (R12)
	VMOVUPS Y5, 32(R12)
	ADDQ R10, R12
	VMOVUPS Y6, (R12)
	VMOVUPS Y7, 32(R12)
	ADDQ $64, BX
	JMP  v4chunk

v4done:
	VZEROUPPER
	RET

// expf32's constants (attn4.go), as float32 bits.
DATA attexp<>+0(SB)/4, $0x3fb8aa3b  // log2e
DATA attexp<>+4(SB)/4, $0x3f317200  // ln2hi
DATA attexp<>+8(SB)/4, $0x35bfbe8e  // ln2lo
DATA attexp<>+12(SB)/4, $0x3f800000 // 1
DATA attexp<>+16(SB)/4, $0x3f000000 // 1/2
DATA attexp<>+20(SB)/4, $0x3e2aaaab // 1/6
DATA attexp<>+24(SB)/4, $0x3d2aaaab // 1/24
DATA attexp<>+28(SB)/4, $0x3c088889 // 1/120
DATA attexp<>+32(SB)/4, $0x3ab60b61 // 1/720
DATA attexp<>+36(SB)/4, $0x39500d01 // 1/5040
DATA attexp<>+40(SB)/4, $0xc2aeac4f // -87.33654
DATA attexp<>+44(SB)/4, $0x42b170a4 // 88.72
DATA attexp<>+48(SB)/4, $0x7f800000 // +Inf
GLOBL attexp<>(SB), RODATA|NOPTR, $52

// func max4AVX512(sc *float32, n int, mx *[4]float32)
// mx[g] = max(mx[g], sc[4t+g] for t < n), n a multiple of 4.
TEXT ·max4AVX512(SB), NOSPLIT, $0-24
	MOVQ sc+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ mx+16(FP), DI
	VBROADCASTI32X4 (DI), Z0
m4loop:
	CMPQ CX, $4
	JLT  m4done
	VMAXPS (SI), Z0, Z0
	ADDQ $64, SI
	SUBQ $4, CX
	JMP  m4loop
m4done:
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVUPS X0, (DI)
	VZEROUPPER
	RET

// func exp4AVX512(sc *float32, n int, mx, sum *[4]float32)
// sc[4t+g] = expf32(sc[4t+g] - mx[g]) for t < n (a multiple of 4), the
// same float32 operations as expf32 lane by lane (no fused multiply-add:
// expf32 has none on amd64), and sum[g] += their sum (added in 4 partial
// sums a group, then together: not expf32's loop's order).
TEXT ·exp4AVX512(SB), NOSPLIT, $0-32
	MOVQ sc+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ mx+16(FP), DI
	VBROADCASTI32X4 (DI), Z31
	VBROADCASTSS attexp<>+0(SB), Z16
	VBROADCASTSS attexp<>+4(SB), Z17
	VBROADCASTSS attexp<>+8(SB), Z18
	VBROADCASTSS attexp<>+12(SB), Z19
	VBROADCASTSS attexp<>+16(SB), Z20
	VBROADCASTSS attexp<>+20(SB), Z21
	VBROADCASTSS attexp<>+24(SB), Z22
	VBROADCASTSS attexp<>+28(SB), Z23
	VBROADCASTSS attexp<>+32(SB), Z24
	VBROADCASTSS attexp<>+36(SB), Z25
	VBROADCASTSS attexp<>+40(SB), Z26
	VBROADCASTSS attexp<>+44(SB), Z27
	VBROADCASTSS attexp<>+48(SB), Z28
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Z29     // sign bit
	VPXORD Z30, Z30, Z30     // the sums
	VPXORD Z15, Z15, Z15     // zeros
	MOVL $127, AX
	VPBROADCASTD AX, Z14     // the exponent bias
e4loop:
	CMPQ CX, $4
	JLT  e4done
	VMOVUPS (SI), Z0
	VSUBPS Z31, Z0, Z0       // x = s - mx
	VMULPS Z16, Z0, Z1       // kf = x*log2e
	VPANDD Z29, Z1, Z2
	VPORD  Z20, Z2, Z2       // +-0.5 by kf's sign (kf = -0: -0.5, the same n)
	VADDPS Z2, Z1, Z1
	VCVTTPS2DQ Z1, Z1        // n
	VCVTDQ2PS Z1, Z2         // nf
	VMULPS Z17, Z2, Z3
	VSUBPS Z3, Z0, Z3        // x - nf*ln2hi
	VMULPS Z18, Z2, Z4
	VSUBPS Z4, Z3, Z3        // r = ... - nf*ln2lo
	VMULPS Z25, Z3, Z4       // r/5040
	VADDPS Z24, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z23, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z22, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z21, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z20, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z19, Z4, Z4
	VMULPS Z4, Z3, Z4
	VADDPS Z19, Z4, Z4       // p
	VPADDD Z14, Z1, Z1
	VPSLLD $23, Z1, Z1       // 2^n
	VMULPS Z1, Z4, Z4        // p * 2^n
	VCMPPS $0x11, Z26, Z0, K1 // x < -87.33654 (ordered)
	VCMPPS $0x1e, Z27, Z0, K2 // x > 88.72
	VCMPPS $3, Z0, Z0, K3     // NaN
	VMOVAPS Z15, K1, Z4
	VMOVAPS Z28, K2, Z4
	VMOVAPS Z0, K3, Z4
	VADDPS Z4, Z30, Z30
	VMOVUPS Z4, (SI)
	ADDQ $64, SI
	SUBQ $4, CX
	JMP  e4loop
e4done:
	MOVQ sum+24(FP), DI
	VEXTRACTF64X4 $1, Z30, Y1
	VADDPS Y1, Y30, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VADDPS (DI), X0, X0
	VMOVUPS X0, (DI)
	VZEROUPPER
	RET
