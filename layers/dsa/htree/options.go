package htree

import "fmt"

// The defaults of seed 003.
const (
	DefaultRate = 16
	DefaultTopK = 512
)

// Options are htree's parameters. The zero value means the defaults.
type Options struct {
	// Rate is the number of children per node (the compression rate); 0: 16.
	Rate int
	// TopK is the number of nodes a query expands per level; 0: 512.
	TopK int
	// TopCandidates is the most candidates a query scores at its top level
	// (0: TopK*Rate). A query at a position below it attends exactly (dense).
	TopCandidates int
}

// WithDefaults fills zero fields with the defaults.
func (o Options) WithDefaults() Options {
	if o.Rate == 0 {
		o.Rate = DefaultRate
	}
	if o.TopK == 0 {
		o.TopK = DefaultTopK
	}
	if o.TopCandidates == 0 {
		o.TopCandidates = o.TopK * o.Rate
	}
	return o
}

// Validate reports a parameter out of range, naming it. It checks the
// options as given: call WithDefaults first to accept zeros.
func (o Options) Validate() error {
	switch {
	case o.Rate < 2:
		return fmt.Errorf("htree: rate %d: want at least 2", o.Rate)
	case o.TopK < 1:
		return fmt.Errorf("htree: top-K %d: want at least 1", o.TopK)
	case o.TopCandidates < 1:
		return fmt.Errorf("htree: top candidates %d: want at least 1", o.TopCandidates)
	case o.TopK > 1<<24 || o.Rate > 1<<16 || o.TopCandidates > 1<<26 || o.TopK*o.Rate > 1<<26:
		return fmt.Errorf("htree: rate %d, top-K %d, top candidates %d: too large", o.Rate, o.TopK, o.TopCandidates)
	}
	return nil
}

// TopLevel is the top level of a query at position t: the lowest level at
// which the nodes up to t number at most TopCandidates.
func (o Options) TopLevel(t int) int {
	l := 0
	for t >= o.TopCandidates {
		t /= o.Rate
		l++
	}
	return l
}

// Levels is the number of levels (tokens included) a cache of capacity
// positions stores: TopLevel(capacity-1)+1.
func (o Options) Levels(capacity int) int { return o.TopLevel(max(capacity, 1)-1) + 1 }

// MaxCandidates bounds the candidates of any level of any query, and so the
// positions a query or key is rotated to.
func (o Options) MaxCandidates() int { return max(o.TopCandidates, o.TopK*o.Rate) }
