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

// attexp's constants, each 8 times (AVX2 has no broadcast operands), then
// the sign bit and the exponent bias 127.
DATA attexp8<>+0(SB)/4, $0x3fb8aa3b // log2e
DATA attexp8<>+4(SB)/4, $0x3fb8aa3b
DATA attexp8<>+8(SB)/4, $0x3fb8aa3b
DATA attexp8<>+12(SB)/4, $0x3fb8aa3b
DATA attexp8<>+16(SB)/4, $0x3fb8aa3b
DATA attexp8<>+20(SB)/4, $0x3fb8aa3b
DATA attexp8<>+24(SB)/4, $0x3fb8aa3b
DATA attexp8<>+28(SB)/4, $0x3fb8aa3b
DATA attexp8<>+32(SB)/4, $0x3f317200 // ln2hi
DATA attexp8<>+36(SB)/4, $0x3f317200
DATA attexp8<>+40(SB)/4, $0x3f317200
DATA attexp8<>+44(SB)/4, $0x3f317200
DATA attexp8<>+48(SB)/4, $0x3f317200
DATA attexp8<>+52(SB)/4, $0x3f317200
DATA attexp8<>+56(SB)/4, $0x3f317200
DATA attexp8<>+60(SB)/4, $0x3f317200
DATA attexp8<>+64(SB)/4, $0x35bfbe8e // ln2lo
DATA attexp8<>+68(SB)/4, $0x35bfbe8e
DATA attexp8<>+72(SB)/4, $0x35bfbe8e
DATA attexp8<>+76(SB)/4, $0x35bfbe8e
DATA attexp8<>+80(SB)/4, $0x35bfbe8e
DATA attexp8<>+84(SB)/4, $0x35bfbe8e
DATA attexp8<>+88(SB)/4, $0x35bfbe8e
DATA attexp8<>+92(SB)/4, $0x35bfbe8e
DATA attexp8<>+96(SB)/4, $0x3f800000 // 1
DATA attexp8<>+100(SB)/4, $0x3f800000
DATA attexp8<>+104(SB)/4, $0x3f800000
DATA attexp8<>+108(SB)/4, $0x3f800000
DATA attexp8<>+112(SB)/4, $0x3f800000
DATA attexp8<>+116(SB)/4, $0x3f800000
DATA attexp8<>+120(SB)/4, $0x3f800000
DATA attexp8<>+124(SB)/4, $0x3f800000
DATA attexp8<>+128(SB)/4, $0x3f000000 // 1/2
DATA attexp8<>+132(SB)/4, $0x3f000000
DATA attexp8<>+136(SB)/4, $0x3f000000
DATA attexp8<>+140(SB)/4, $0x3f000000
DATA attexp8<>+144(SB)/4, $0x3f000000
DATA attexp8<>+148(SB)/4, $0x3f000000
DATA attexp8<>+152(SB)/4, $0x3f000000
DATA attexp8<>+156(SB)/4, $0x3f000000
DATA attexp8<>+160(SB)/4, $0x3e2aaaab // 1/6
DATA attexp8<>+164(SB)/4, $0x3e2aaaab
DATA attexp8<>+168(SB)/4, $0x3e2aaaab
DATA attexp8<>+172(SB)/4, $0x3e2aaaab
DATA attexp8<>+176(SB)/4, $0x3e2aaaab
DATA attexp8<>+180(SB)/4, $0x3e2aaaab
DATA attexp8<>+184(SB)/4, $0x3e2aaaab
DATA attexp8<>+188(SB)/4, $0x3e2aaaab
DATA attexp8<>+192(SB)/4, $0x3d2aaaab // 1/24
DATA attexp8<>+196(SB)/4, $0x3d2aaaab
DATA attexp8<>+200(SB)/4, $0x3d2aaaab
DATA attexp8<>+204(SB)/4, $0x3d2aaaab
DATA attexp8<>+208(SB)/4, $0x3d2aaaab
DATA attexp8<>+212(SB)/4, $0x3d2aaaab
DATA attexp8<>+216(SB)/4, $0x3d2aaaab
DATA attexp8<>+220(SB)/4, $0x3d2aaaab
DATA attexp8<>+224(SB)/4, $0x3c088889 // 1/120
DATA attexp8<>+228(SB)/4, $0x3c088889
DATA attexp8<>+232(SB)/4, $0x3c088889
DATA attexp8<>+236(SB)/4, $0x3c088889
DATA attexp8<>+240(SB)/4, $0x3c088889
DATA attexp8<>+244(SB)/4, $0x3c088889
DATA attexp8<>+248(SB)/4, $0x3c088889
DATA attexp8<>+252(SB)/4, $0x3c088889
DATA attexp8<>+256(SB)/4, $0x3ab60b61 // 1/720
DATA attexp8<>+260(SB)/4, $0x3ab60b61
DATA attexp8<>+264(SB)/4, $0x3ab60b61
DATA attexp8<>+268(SB)/4, $0x3ab60b61
DATA attexp8<>+272(SB)/4, $0x3ab60b61
DATA attexp8<>+276(SB)/4, $0x3ab60b61
DATA attexp8<>+280(SB)/4, $0x3ab60b61
DATA attexp8<>+284(SB)/4, $0x3ab60b61
DATA attexp8<>+288(SB)/4, $0x39500d01 // 1/5040
DATA attexp8<>+292(SB)/4, $0x39500d01
DATA attexp8<>+296(SB)/4, $0x39500d01
DATA attexp8<>+300(SB)/4, $0x39500d01
DATA attexp8<>+304(SB)/4, $0x39500d01
DATA attexp8<>+308(SB)/4, $0x39500d01
DATA attexp8<>+312(SB)/4, $0x39500d01
DATA attexp8<>+316(SB)/4, $0x39500d01
DATA attexp8<>+320(SB)/4, $0xc2aeac4f // -87.33654
DATA attexp8<>+324(SB)/4, $0xc2aeac4f
DATA attexp8<>+328(SB)/4, $0xc2aeac4f
DATA attexp8<>+332(SB)/4, $0xc2aeac4f
DATA attexp8<>+336(SB)/4, $0xc2aeac4f
DATA attexp8<>+340(SB)/4, $0xc2aeac4f
DATA attexp8<>+344(SB)/4, $0xc2aeac4f
DATA attexp8<>+348(SB)/4, $0xc2aeac4f
DATA attexp8<>+352(SB)/4, $0x42b170a4 // 88.72
DATA attexp8<>+356(SB)/4, $0x42b170a4
DATA attexp8<>+360(SB)/4, $0x42b170a4
DATA attexp8<>+364(SB)/4, $0x42b170a4
DATA attexp8<>+368(SB)/4, $0x42b170a4
DATA attexp8<>+372(SB)/4, $0x42b170a4
DATA attexp8<>+376(SB)/4, $0x42b170a4
DATA attexp8<>+380(SB)/4, $0x42b170a4
DATA attexp8<>+384(SB)/4, $0x7f800000 // +Inf
DATA attexp8<>+388(SB)/4, $0x7f800000
DATA attexp8<>+392(SB)/4, $0x7f800000
DATA attexp8<>+396(SB)/4, $0x7f800000
DATA attexp8<>+400(SB)/4, $0x7f800000
DATA attexp8<>+404(SB)/4, $0x7f800000
DATA attexp8<>+408(SB)/4, $0x7f800000
DATA attexp8<>+412(SB)/4, $0x7f800000
DATA attexp8<>+416(SB)/4, $0x80000000 // sign bit
DATA attexp8<>+420(SB)/4, $0x80000000
DATA attexp8<>+424(SB)/4, $0x80000000
DATA attexp8<>+428(SB)/4, $0x80000000
DATA attexp8<>+432(SB)/4, $0x80000000
DATA attexp8<>+436(SB)/4, $0x80000000
DATA attexp8<>+440(SB)/4, $0x80000000
DATA attexp8<>+444(SB)/4, $0x80000000
DATA attexp8<>+448(SB)/4, $0x0000007f // exponent bias
DATA attexp8<>+452(SB)/4, $0x0000007f
DATA attexp8<>+456(SB)/4, $0x0000007f
DATA attexp8<>+460(SB)/4, $0x0000007f
DATA attexp8<>+464(SB)/4, $0x0000007f
DATA attexp8<>+468(SB)/4, $0x0000007f
DATA attexp8<>+472(SB)/4, $0x0000007f
DATA attexp8<>+476(SB)/4, $0x0000007f
GLOBL attexp8<>(SB), RODATA|NOPTR, $480

// func max4AVX2(sc *float32, n int, mx *[4]float32)
// max4AVX512 on AVX2: two rows a step (n a multiple of 4).
TEXT ·max4AVX2(SB), NOSPLIT, $0-24
	MOVQ sc+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ mx+16(FP), DI
	VBROADCASTF128 (DI), Y0
m2loop:
	CMPQ CX, $2
	JLT  m2done
	VMAXPS (SI), Y0, Y0
	ADDQ $32, SI
	SUBQ $2, CX
	JMP  m2loop
m2done:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVUPS X0, (DI)
	VZEROUPPER
	RET

// func exp4AVX2(sc *float32, n int, mx, sum *[4]float32)
// exp4AVX512 on AVX2: two rows a step (n a multiple of 4), the same
// float32 operations lane by lane, the out-of-range lanes set by blends;
// the sums in 2 partial sums a group, then together.
TEXT ·exp4AVX2(SB), NOSPLIT, $0-32
	MOVQ sc+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ mx+16(FP), DI
	VBROADCASTF128 (DI), Y5
	VMOVUPS attexp8<>+0(SB), Y8       // log2e
	VMOVUPS attexp8<>+32(SB), Y9       // ln2hi
	VMOVUPS attexp8<>+64(SB), Y10      // ln2lo
	VMOVUPS attexp8<>+96(SB), Y11      // 1
	VMOVUPS attexp8<>+128(SB), Y12      // 1/2
	VMOVUPS attexp8<>+416(SB), Y13     // sign bit
	VMOVUPS attexp8<>+448(SB), Y14     // the exponent bias
	VXORPS Y6, Y6, Y6        // the sums
e2loop:
	CMPQ CX, $2
	JLT  e2done
	VMOVUPS (SI), Y0
	VSUBPS Y5, Y0, Y0        // x = s - mx
	VMULPS Y8, Y0, Y1        // kf = x*log2e
	VANDPS Y13, Y1, Y2
	VORPS  Y12, Y2, Y2       // +-0.5 by kf's sign
	VADDPS Y2, Y1, Y1
	VCVTTPS2DQ Y1, Y1        // n
	VCVTDQ2PS Y1, Y2         // nf
	VMULPS Y9, Y2, Y3
	VSUBPS Y3, Y0, Y3        // x - nf*ln2hi
	VMULPS Y10, Y2, Y4
	VSUBPS Y4, Y3, Y3        // r = ... - nf*ln2lo
	VMULPS attexp8<>+288(SB), Y3, Y4    // r/5040
	VADDPS attexp8<>+256(SB), Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS attexp8<>+224(SB), Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS attexp8<>+192(SB), Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS attexp8<>+160(SB), Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS Y12, Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS Y11, Y4, Y4
	VMULPS Y4, Y3, Y4
	VADDPS Y11, Y4, Y4       // p
	VPADDD Y14, Y1, Y1
	VPSLLD $23, Y1, Y1       // 2^n
	VMULPS Y1, Y4, Y4        // p * 2^n
	VCMPPS $0x11, attexp8<>+320(SB), Y0, Y2 // x < -87.33654 (ordered)
	VANDNPS Y4, Y2, Y4       // 0 there
	VCMPPS $0x1e, attexp8<>+352(SB), Y0, Y2 // x > 88.72
	VBLENDVPS Y2, attexp8<>+384(SB), Y4, Y4 // +Inf there
	VCMPPS $3, Y0, Y0, Y2    // NaN
	VBLENDVPS Y2, Y0, Y4, Y4 // x there
	VADDPS Y4, Y6, Y6
	VMOVUPS Y4, (SI)
	ADDQ $32, SI
	SUBQ $2, CX
	JMP  e2loop
e2done:
	MOVQ sum+24(FP), DI
	VEXTRACTF128 $1, Y6, X1
	VADDPS X1, X6, X0
	VADDPS (DI), X0, X0
	VMOVUPS X0, (DI)
	VZEROUPPER
	RET
