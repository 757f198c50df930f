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
