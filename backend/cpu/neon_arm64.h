// Macros shared by the NEON kernels (*_arm64.s). Instructions Go's
// assembler has no mnemonic for are WORDs with their GNU syntax in a
// comment (dev/arm64/words.sh checks them).

// ZERO4(a, b, c, d): the four vectors zeroed.
#define ZERO4(a, b, c, d) \
	VEOR a.B16, a.B16, a.B16; \
	VEOR b.B16, b.B16, b.B16; \
	VEOR c.B16, c.B16, c.B16; \
	VEOR d.B16, d.B16, d.B16

// SUM4ROWS: lane g of V16 = all lanes of V16+2g and V17+2g (g < 4), the
// sums of 4 rows with two accumulators each.
#define SUM4ROWS \
	WORD $0x4e31d610 /* fadd v16.4s, v16.4s, v17.4s */; \
	WORD $0x4e33d652 /* fadd v18.4s, v18.4s, v19.4s */; \
	WORD $0x4e35d694 /* fadd v20.4s, v20.4s, v21.4s */; \
	WORD $0x4e37d6d6 /* fadd v22.4s, v22.4s, v23.4s */; \
	WORD $0x6e32d610 /* faddp v16.4s, v16.4s, v18.4s */; \
	WORD $0x6e36d694 /* faddp v20.4s, v20.4s, v22.4s */; \
	WORD $0x6e34d610 /* faddp v16.4s, v16.4s, v20.4s */
