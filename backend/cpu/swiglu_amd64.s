#include "textflag.h"

// The constants of math.Exp's amd64 assembly (archExp, its FMA path), the
// same literals.
DATA swexp<>+0(SB)/8, $1.4426950408889634073599246810018920              // LOG2E
DATA swexp<>+8(SB)/8, $0.69314718055966295651160180568695068359375       // LN2U
DATA swexp<>+16(SB)/8, $0.28235290563031577122588448175013436025525412068e-12 // LN2L
DATA swexp<>+24(SB)/8, $0.0625
DATA swexp<>+32(SB)/8, $2.4801587301587301587e-5
DATA swexp<>+40(SB)/8, $1.9841269841269841270e-4
DATA swexp<>+48(SB)/8, $1.3888888888888888889e-3
DATA swexp<>+56(SB)/8, $8.3333333333333333333e-3
DATA swexp<>+64(SB)/8, $4.1666666666666666667e-2
DATA swexp<>+72(SB)/8, $1.6666666666666666667e-1
DATA swexp<>+80(SB)/8, $0.5
DATA swexp<>+88(SB)/8, $1.0
DATA swexp<>+96(SB)/8, $2.0
DATA swexp<>+104(SB)/8, $7.09782712893384e+02 // Overflow
DATA swexp<>+112(SB)/8, $1023
DATA swexp<>+120(SB)/8, $2047
GLOBL swexp<>(SB), RODATA|NOPTR, $128

// func swigluAVX512(dst, gate, up *float32, n int)
// layers.SwiGLU without a limit for n a multiple of 8: dst = g / (1 +
// float32(exp(float64(-g)))) * u, the exponential evaluated as math.Exp's
// amd64 assembly does it (its FMA path: the same float64 operations in the
// same order, 8 lanes at a time), so the same results bit for bit. Lanes
// whose exponent leaves the normal range take archExp's answers: +Inf past
// the overflow bound or at a biased exponent of 2047 and more, a value
// float32 rounds to 0 at a biased exponent of 0 or less (its denormal
// path's results are all below 2^-1021); a NaN gate is a NaN output either
// way (the division passes g's NaN on).
TEXT ·swigluAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSD swexp<>+0(SB), Z16
	VBROADCASTSD swexp<>+8(SB), Z17
	VBROADCASTSD swexp<>+16(SB), Z18
	VBROADCASTSD swexp<>+24(SB), Z19
	VBROADCASTSD swexp<>+32(SB), Z20
	VBROADCASTSD swexp<>+40(SB), Z21
	VBROADCASTSD swexp<>+48(SB), Z22
	VBROADCASTSD swexp<>+56(SB), Z23
	VBROADCASTSD swexp<>+64(SB), Z24
	VBROADCASTSD swexp<>+72(SB), Z25
	VBROADCASTSD swexp<>+80(SB), Z26
	VBROADCASTSD swexp<>+88(SB), Z27
	VBROADCASTSD swexp<>+96(SB), Z28
	VBROADCASTSD swexp<>+104(SB), Z29
	VPBROADCASTQ swexp<>+112(SB), Z30
	VPBROADCASTQ swexp<>+120(SB), Z31
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Y15     // float32 sign bit
	MOVL $0x3f800000, AX
	VPBROADCASTD AX, Y14     // float32 1
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Y13     // float32 +Inf
	VPXORD Z12, Z12, Z12     // zeros

swloop:
	CMPQ CX, $8
	JLT  swdone
	VMOVUPS (SI), Y0         // g
	VXORPS Y15, Y0, Y1       // -g
	VCVTPS2PD Y1, Z1         // x = float64(-g)
	VCMPPD $0x1e, Z29, Z1, K3 // x > Overflow
	VMULPD Z16, Z1, Z2       // x*LOG2E
	VCVTPD2DQ Z2, Y3         // k, rounded to nearest
	VCVTDQ2PD Y3, Z2
	VFNMADD231PD Z17, Z2, Z1 // x -= k*LN2U
	VFNMADD231PD Z18, Z2, Z1 // x -= k*LN2L
	VMULPD Z19, Z1, Z1       // x *= 1/16
	VMOVAPD Z20, Z4
	VFMADD213PD Z21, Z1, Z4  // the Taylor series, Horner
	VFMADD213PD Z22, Z1, Z4
	VFMADD213PD Z23, Z1, Z4
	VFMADD213PD Z24, Z1, Z4
	VFMADD213PD Z25, Z1, Z4
	VFMADD213PD Z26, Z1, Z4
	VFMADD213PD Z27, Z1, Z4
	VMULPD Z4, Z1, Z1
	VADDPD Z28, Z1, Z4       // squared four times: (x+2)*x ...
	VMULPD Z4, Z1, Z1
	VADDPD Z28, Z1, Z4
	VMULPD Z4, Z1, Z1
	VADDPD Z28, Z1, Z4
	VMULPD Z4, Z1, Z1
	VADDPD Z28, Z1, Z4
	VFMADD213PD Z27, Z4, Z1  // ... the last one plus 1, fused
	VPMOVSXDQ Y3, Z5
	VPADDQ Z30, Z5, Z5       // biased exponent
	VPCMPQ $2, Z12, Z5, K1   // <= 0
	VPCMPQ $5, Z31, Z5, K2   // >= 2047
	KORW K2, K3, K2
	VPSLLQ $52, Z5, Z6
	VMULPD Z6, Z1, Z1        // fr * 2^k
	VCVTPD2PS Z1, Y7         // float32
	VMOVAPS Y12, K1, Y7
	VMOVAPS Y13, K2, Y7
	VADDPS Y14, Y7, Y7       // 1 + e
	VDIVPS Y7, Y0, Y8        // g / (1 + e)
	VMULPS (DX), Y8, Y8      // * u
	VMOVUPS Y8, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  swloop

swdone:
	VZEROUPPER
	RET
