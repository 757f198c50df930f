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

// The same constants, each four times (AVX2 has no broadcast operands),
// and 2046 (the exponent bound as a "greater than"), +Inf; then the float32
// sign bit and 1, four times.
DATA swexp4<>+0(SB)/8, $1.4426950408889634073599246810018920
DATA swexp4<>+8(SB)/8, $1.4426950408889634073599246810018920
DATA swexp4<>+16(SB)/8, $1.4426950408889634073599246810018920
DATA swexp4<>+24(SB)/8, $1.4426950408889634073599246810018920
DATA swexp4<>+32(SB)/8, $0.69314718055966295651160180568695068359375
DATA swexp4<>+40(SB)/8, $0.69314718055966295651160180568695068359375
DATA swexp4<>+48(SB)/8, $0.69314718055966295651160180568695068359375
DATA swexp4<>+56(SB)/8, $0.69314718055966295651160180568695068359375
DATA swexp4<>+64(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA swexp4<>+72(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA swexp4<>+80(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA swexp4<>+88(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA swexp4<>+96(SB)/8, $0.0625
DATA swexp4<>+104(SB)/8, $0.0625
DATA swexp4<>+112(SB)/8, $0.0625
DATA swexp4<>+120(SB)/8, $0.0625
DATA swexp4<>+128(SB)/8, $2.4801587301587301587e-5
DATA swexp4<>+136(SB)/8, $2.4801587301587301587e-5
DATA swexp4<>+144(SB)/8, $2.4801587301587301587e-5
DATA swexp4<>+152(SB)/8, $2.4801587301587301587e-5
DATA swexp4<>+160(SB)/8, $1.9841269841269841270e-4
DATA swexp4<>+168(SB)/8, $1.9841269841269841270e-4
DATA swexp4<>+176(SB)/8, $1.9841269841269841270e-4
DATA swexp4<>+184(SB)/8, $1.9841269841269841270e-4
DATA swexp4<>+192(SB)/8, $1.3888888888888888889e-3
DATA swexp4<>+200(SB)/8, $1.3888888888888888889e-3
DATA swexp4<>+208(SB)/8, $1.3888888888888888889e-3
DATA swexp4<>+216(SB)/8, $1.3888888888888888889e-3
DATA swexp4<>+224(SB)/8, $8.3333333333333333333e-3
DATA swexp4<>+232(SB)/8, $8.3333333333333333333e-3
DATA swexp4<>+240(SB)/8, $8.3333333333333333333e-3
DATA swexp4<>+248(SB)/8, $8.3333333333333333333e-3
DATA swexp4<>+256(SB)/8, $4.1666666666666666667e-2
DATA swexp4<>+264(SB)/8, $4.1666666666666666667e-2
DATA swexp4<>+272(SB)/8, $4.1666666666666666667e-2
DATA swexp4<>+280(SB)/8, $4.1666666666666666667e-2
DATA swexp4<>+288(SB)/8, $1.6666666666666666667e-1
DATA swexp4<>+296(SB)/8, $1.6666666666666666667e-1
DATA swexp4<>+304(SB)/8, $1.6666666666666666667e-1
DATA swexp4<>+312(SB)/8, $1.6666666666666666667e-1
DATA swexp4<>+320(SB)/8, $0.5
DATA swexp4<>+328(SB)/8, $0.5
DATA swexp4<>+336(SB)/8, $0.5
DATA swexp4<>+344(SB)/8, $0.5
DATA swexp4<>+352(SB)/8, $1.0
DATA swexp4<>+360(SB)/8, $1.0
DATA swexp4<>+368(SB)/8, $1.0
DATA swexp4<>+376(SB)/8, $1.0
DATA swexp4<>+384(SB)/8, $2.0
DATA swexp4<>+392(SB)/8, $2.0
DATA swexp4<>+400(SB)/8, $2.0
DATA swexp4<>+408(SB)/8, $2.0
DATA swexp4<>+416(SB)/8, $7.09782712893384e+02
DATA swexp4<>+424(SB)/8, $7.09782712893384e+02
DATA swexp4<>+432(SB)/8, $7.09782712893384e+02
DATA swexp4<>+440(SB)/8, $7.09782712893384e+02
DATA swexp4<>+448(SB)/8, $1023
DATA swexp4<>+456(SB)/8, $1023
DATA swexp4<>+464(SB)/8, $1023
DATA swexp4<>+472(SB)/8, $1023
DATA swexp4<>+480(SB)/8, $2046
DATA swexp4<>+488(SB)/8, $2046
DATA swexp4<>+496(SB)/8, $2046
DATA swexp4<>+504(SB)/8, $2046
DATA swexp4<>+512(SB)/8, $0x7ff0000000000000
DATA swexp4<>+520(SB)/8, $0x7ff0000000000000
DATA swexp4<>+528(SB)/8, $0x7ff0000000000000
DATA swexp4<>+536(SB)/8, $0x7ff0000000000000
DATA swexp4<>+544(SB)/4, $0x80000000
DATA swexp4<>+548(SB)/4, $0x80000000
DATA swexp4<>+552(SB)/4, $0x80000000
DATA swexp4<>+556(SB)/4, $0x80000000
DATA swexp4<>+560(SB)/4, $0x3f800000
DATA swexp4<>+564(SB)/4, $0x3f800000
DATA swexp4<>+568(SB)/4, $0x3f800000
DATA swexp4<>+572(SB)/4, $0x3f800000
GLOBL swexp4<>(SB), RODATA|NOPTR, $576

// func swigluAVX2(dst, gate, up *float32, n int)
// swigluAVX512 on AVX2, 4 lanes at a time (n a multiple of 4): the same
// float64 operations in the same order, the out-of-range lanes set in
// float64 before the rounding to float32 (0 and +Inf round to themselves),
// so the same results bit for bit.
TEXT ·swigluAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	VMOVUPD swexp4<>+0(SB), Y8
	VMOVUPD swexp4<>+32(SB), Y9
	VMOVUPD swexp4<>+64(SB), Y10
	VMOVUPD swexp4<>+96(SB), Y11
	VMOVUPD swexp4<>+384(SB), Y12
	VMOVUPD swexp4<>+352(SB), Y13
	VPXOR   Y15, Y15, Y15    // zeros

s2loop:
	CMPQ CX, $4
	JLT  s2done
	VMOVUPS (SI), X0         // g
	VXORPS swexp4<>+544(SB), X0, X1 // -g
	VCVTPS2PD X1, Y1         // x = float64(-g)
	VCMPPD $0x1e, swexp4<>+416(SB), Y1, Y14 // x > Overflow
	VMULPD Y8, Y1, Y2        // x*LOG2E
	VCVTPD2DQY Y2, X3        // k, rounded to nearest
	VCVTDQ2PD X3, Y2
	VFNMADD231PD Y9, Y2, Y1  // x -= k*LN2U
	VFNMADD231PD Y10, Y2, Y1 // x -= k*LN2L
	VMULPD Y11, Y1, Y1       // x *= 1/16
	VMOVUPD swexp4<>+128(SB), Y4
	VFMADD213PD swexp4<>+160(SB), Y1, Y4 // the Taylor series, Horner
	VFMADD213PD swexp4<>+192(SB), Y1, Y4
	VFMADD213PD swexp4<>+224(SB), Y1, Y4
	VFMADD213PD swexp4<>+256(SB), Y1, Y4
	VFMADD213PD swexp4<>+288(SB), Y1, Y4
	VFMADD213PD swexp4<>+320(SB), Y1, Y4
	VFMADD213PD Y13, Y1, Y4
	VMULPD Y4, Y1, Y1
	VADDPD Y12, Y1, Y4       // squared four times: (x+2)*x ...
	VMULPD Y4, Y1, Y1
	VADDPD Y12, Y1, Y4
	VMULPD Y4, Y1, Y1
	VADDPD Y12, Y1, Y4
	VMULPD Y4, Y1, Y1
	VADDPD Y12, Y1, Y4
	VFMADD213PD Y13, Y4, Y1  // ... the last one plus 1, fused
	VPMOVSXDQ X3, Y5
	VPADDQ swexp4<>+448(SB), Y5, Y5 // biased exponent
	VPCMPGTQ Y15, Y5, Y7     // > 0
	VPCMPGTQ swexp4<>+480(SB), Y5, Y6 // >= 2047
	VORPD Y14, Y6, Y6
	VPSLLQ $52, Y5, Y5
	VMULPD Y5, Y1, Y1        // fr * 2^k
	VANDPD Y7, Y1, Y1        // 0 where the exponent is not above 0
	VBLENDVPD Y6, swexp4<>+512(SB), Y1, Y1 // +Inf past the bounds
	VCVTPD2PSY Y1, X7        // float32
	VADDPS swexp4<>+560(SB), X7, X7 // 1 + e
	VDIVPS X7, X0, X0        // g / (1 + e)
	VMULPS (DX), X0, X0      // * u
	VMOVUPS X0, (DI)
	ADDQ $16, SI
	ADDQ $16, DX
	ADDQ $16, DI
	SUBQ $4, CX
	JMP  s2loop

s2done:
	VZEROUPPER
	RET
