package layers

// PagedSeq is one sequence of a paged attention call: its block table
// (position p lies in block Table[p/blockSize], row p%blockSize) and the
// Rows query rows it runs, at positions Pos0..Pos0+Rows-1.
type PagedSeq struct {
	Table      []int32
	Pos0, Rows int
}

// PagedRow is the pool row of position p of a sequence whose block table
// is table.
func PagedRow(table []int32, blockSize, p int) int {
	return int(table[p/blockSize])*blockSize + p%blockSize
}

// PagedWrite copies rows ([m, width]) into pool ([blocks*blockSize, width])
// at positions pos0..pos0+m-1 of the sequence whose block table is table.
func PagedWrite(pool, rows []float32, table []int32, blockSize, width, pos0, m int) {
	for i := 0; i < m; i++ {
		r := PagedRow(table, blockSize, pos0+i)
		copy(pool[r*width:(r+1)*width], rows[i*width:(i+1)*width])
	}
}

// PagedGather returns positions 0..n-1 of a sequence's rows of pool
// ([blocks*blockSize, width]) as one contiguous [n, width] block.
func PagedGather(pool []float32, table []int32, blockSize, width, n int) []float32 {
	out := make([]float32, n*width)
	for p := 0; p < n; p++ {
		r := PagedRow(table, blockSize, p)
		copy(out[p*width:(p+1)*width], pool[r*width:(r+1)*width])
	}
	return out
}

// PagedAttention is Attention for each sequence of seqs over its keys and
// values read through its block table from kPool and vPool
// ([blocks*blockSize, KVHeads, HeadDim]): q and out are [sum Rows, Heads,
// HeadDim], the rows of seqs[0] first.
func PagedAttention(out, q, kPool, vPool []float32, seqs []PagedSeq, blockSize int, s AttentionShape) {
	width, qw := s.KVHeads*s.HeadDim, s.Heads*s.HeadDim
	row := 0
	for _, sq := range seqs {
		n := sq.Pos0 + sq.Rows
		keys := PagedGather(kPool, sq.Table, blockSize, width, n)
		values := PagedGather(vPool, sq.Table, blockSize, width, n)
		Attention(out[row*qw:(row+sq.Rows)*qw], q[row*qw:(row+sq.Rows)*qw], keys, values, sq.Rows, sq.Pos0, s)
		row += sq.Rows
	}
}

// WindowStart is the first position a query at p sees under a sliding
// window of window positions (0: none).
func WindowStart(p, window int) int {
	if window > 0 {
		return max(0, p-window+1)
	}
	return 0
}
