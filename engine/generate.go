package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/tokenizer"
)

// ErrContextFull is returned when tokens do not fit in a session.
var ErrContextFull = errors.New("context full")

// GenerateOptions control Generate.
type GenerateOptions struct {
	// MaxTokens bounds the generated tokens (0: until a stop token or the
	// end of the context).
	MaxTokens int
	// Sampling chooses each token.
	Sampling SamplingOptions
	// StopTokens end generation (the stop token is reported and kept). Nil
	// means the model's EOS tokens; an empty non-nil slice means none.
	StopTokens []int
	// StopStrings end generation as soon as the generated text contains one
	// of them (the model needs a tokenizer). Neither the stop string nor
	// anything after it is streamed; the token that completed it is kept, as a
	// stop token is. Text that might begin a stop string is streamed only once
	// the next token shows that it does not, so a token's Text may then be
	// shorter than its text and a later token's longer.
	StopStrings []string
	// LogProbs sets each Token's LogProb: the model's log-probability of
	// the token chosen. TopLogProbs > 0 also sets Token.TopLogProbs to the
	// TopLogProbs most likely tokens of each step (at most MaxTopLogProbs).
	// Both are of the model's own distribution, the log-softmax of its
	// logits, before the sampling options change them (repetition penalty,
	// temperature, top-k, top-p, min-p): greedy and sampled generation
	// report the same numbers for the same token.
	//
	// On a GPU the token is otherwise picked on the device and only its id
	// comes back; with log-probabilities asked for, every step's logits come
	// back to the host and the token is picked there instead, by the same
	// rule and random stream as on the CPU (slower, never other numbers).
	LogProbs    bool
	TopLogProbs int
	// Constraint, when not nil, restricts the tokens picked (constrained
	// output, e.g. Model.NewJSONConstraint); the token is then picked on
	// the host. Log-probabilities stay the model's own, before the mask.
	// A Constraint serves one call.
	Constraint Constraint
}

// MaxTopLogProbs bounds GenerateOptions.TopLogProbs.
const MaxTopLogProbs = 20

// TokenLogProb is a token and its log-probability.
type TokenLogProb struct {
	ID      int
	LogProb float32
}

// Token is one generated token, as streamed.
type Token struct {
	ID    int
	Index int // 0 for the first generated token
	// Text is the token's text when the model has a tokenizer: special
	// tokens give none, and bytes of a character split across tokens wait
	// for the token that completes it.
	Text string
	// LogProb is the model's log-probability of the token (natural log,
	// before sampling transforms), when GenerateOptions.LogProbs or
	// TopLogProbs asks for it; otherwise 0.
	LogProb float32
	// TopLogProbs are the GenerateOptions.TopLogProbs most likely tokens of
	// this step, most likely first (ties: lower id first); they may or may
	// not include the token chosen.
	TopLogProbs []TokenLogProb
}

// StopReason says why generation ended.
type StopReason string

// The reasons Generate stops.
const (
	StopToken     StopReason = "stop token"
	StopString    StopReason = "stop string"
	StopMaxTokens StopReason = "max tokens"
	StopContext   StopReason = "context full"
)

// Result summarizes a Generate call.
type Result struct {
	Tokens []int
	// Text is the generated text when the model has a tokenizer: every
	// Token.Text streamed, joined (so without a stop string, and without
	// the bytes of a character the last token left unfinished).
	Text           string
	Reason         StopReason
	PromptTokens   int
	PromptDuration time.Duration // the prefill
	DecodeDuration time.Duration // from the first generated token to the last
}

// PromptTokensPerSecond is the prefill rate.
func (r *Result) PromptTokensPerSecond() float64 {
	return float64(r.PromptTokens) / r.PromptDuration.Seconds()
}

// DecodeTokensPerSecond is the rate of tokens after the first (each needs one
// forward pass of one token).
func (r *Result) DecodeTokensPerSecond() float64 {
	if len(r.Tokens) < 2 || r.DecodeDuration <= 0 {
		return 0
	}
	return float64(len(r.Tokens)-1) / r.DecodeDuration.Seconds()
}

// Generate appends prompt to the session and generates tokens after it,
// calling stream (if not nil) with each token as soon as it is chosen. An
// error from stream, ctx's cancellation, Model.Close, or an error decoding a
// token's text (a regex of tokenizer.json past its time limit) stops
// generation and is returned with the tokens generated so far.
//
// Afterwards the session holds the prompt and every token of the Result,
// whether generation ended normally or with an error, so that Len grows by
// exactly len(prompt) + len(Result.Tokens) and a later Generate continues
// the conversation with every token the caller saw. (Tokens the model has
// not run yet, such as the prompt of a cancelled prefill or the last token
// kept, run at the start of the next call.) Only errors about the arguments
// (an empty prompt, options out of range, a prompt longer than the free
// context), returned before anything runs, leave the session unchanged.
func (s *Session) Generate(ctx context.Context, prompt []int, opts GenerateOptions, stream func(Token) error) (*Result, error) {
	if err := s.m.acquire(); err != nil {
		return nil, err
	}
	defer s.m.done()
	if len(prompt) == 0 && len(s.tokens) == 0 {
		return nil, fmt.Errorf("engine: generate: empty prompt")
	}
	if err := s.m.checkOptions(opts); err != nil {
		return nil, err
	}
	if s.m.sched != nil {
		s.m.sched.enter()
		defer s.m.sched.leave()
	}
	if free := s.st.Cap() - len(s.tokens); len(prompt) > free {
		return nil, fmt.Errorf("engine: prompt of %d tokens is longer than the %d free positions of the context (%d): %w",
			len(prompt), free, s.st.Cap(), ErrContextFull)
	}
	stops := opts.StopTokens
	if stops == nil {
		stops = s.m.EOSTokens()
	}
	res := &Result{PromptTokens: len(prompt)}
	var text *tokenizer.StreamDecoder
	if s.m.tok != nil {
		// The text of the first new token is what it adds after the tokens
		// before it (SentencePiece drops a leading space at a text's start).
		// Priming is best effort: a decoder that fails on the context
		// decodes the new tokens alone, and fails on them if it must.
		text = s.m.tok.NewStreamDecoderSkipSpecial()
		lead := prompt // its last tokens, with the session's before them when it is short
		if n := tokenizer.PrimeTokens - len(prompt); n > 0 {
			lead = slices.Concat(s.tokens[max(0, len(s.tokens)-n):], prompt)
		}
		if text.Prime(lead) != nil {
			text = s.m.tok.NewStreamDecoderSkipSpecial()
		}
	}
	held := stopText{stops: opts.StopStrings}
	var streamed strings.Builder
	pick := s.picker(NewSampler(opts.Sampling), logProbOptions{opts.LogProbs || opts.TopLogProbs > 0, opts.TopLogProbs}, opts.Constraint)
	// However generation ends, the session holds the prompt and every token
	// of the result, so that a resumed conversation has every token the
	// caller saw: a token streamed before a cancellation or a stream error
	// (or a prompt whose prefill was cancelled) is kept unrun, and the next
	// call runs it first. A run that pick queued ahead of a token the
	// session does not keep leaves the cache with it.
	before := len(s.tokens)
	defer func() {
		res.Text = streamed.String()
		if n := len(s.tokens) - before; n < len(prompt)+len(res.Tokens) {
			s.tokens = append(s.tokens, slices.Concat(prompt, res.Tokens)[n:]...)
		}
		if s.st.Len() > len(s.tokens) {
			s.st.Truncate(len(s.tokens))
		}
	}()
	// more: a token may follow the one pick returns (by count), so pick may
	// queue its run ahead.
	more := func(n int) bool { return opts.MaxTokens <= 0 || n+1 < opts.MaxTokens }
	start := time.Now()
	t, err := pick(ctx, prompt, more(0))
	if err != nil {
		return res, err
	}
	res.PromptDuration = time.Since(start)
	first := time.Now()
	for {
		if len(s.tokens) >= s.st.Cap() {
			res.Reason = StopContext // no position left for the token
			return res, nil
		}
		tok := t.ID
		res.Tokens = append(res.Tokens, tok)
		res.DecodeDuration = time.Since(first)
		t.Index = len(res.Tokens) - 1
		switch {
		case slices.Contains(stops, tok):
			res.Reason = StopToken
		case opts.MaxTokens > 0 && len(res.Tokens) >= opts.MaxTokens:
			res.Reason = StopMaxTokens
		}
		if text != nil {
			if t.Text, err = text.Add(tok); err != nil {
				return res, fmt.Errorf("engine: generate: text of token %d: %w", tok, err)
			}
			if len(held.stops) > 0 {
				// The last token streamed (the next finds no position) takes what is held.
				last := res.Reason != "" || len(s.tokens)+1 >= s.st.Cap()
				var stopped bool
				if t.Text, stopped = held.add(t.Text, last); stopped {
					res.Reason = StopString
				}
			}
		}
		streamed.WriteString(t.Text)
		if stream != nil {
			if err := stream(t); err != nil {
				return res, err
			}
		}
		if res.Reason != "" {
			// Kept (by the deferred call). Unless pick queued its run ahead
			// (the cache then holds it), it has not run: the next Append
			// runs it first.
			return res, nil
		}
		if err := s.m.closing(); err != nil {
			return res, err
		}
		if t, err = pick(ctx, []int{tok}, more(len(res.Tokens))); err != nil {
			return res, err
		}
		res.DecodeDuration = time.Since(first)
	}
}

// checkOptions reports the first of opts out of its range, or one the
// model cannot honour.
func (m *Model) checkOptions(opts GenerateOptions) error {
	if opts.MaxTokens < 0 {
		return fmt.Errorf("engine: generate: MaxTokens %d: want >= 0 (0: until a stop token or the end of the context)", opts.MaxTokens)
	}
	if err := opts.Sampling.Validate(); err != nil {
		return err
	}
	for i, st := range opts.StopStrings {
		if st == "" {
			return fmt.Errorf("engine: generate: StopStrings[%d] is empty", i)
		}
	}
	if opts.TopLogProbs < 0 || opts.TopLogProbs > MaxTopLogProbs {
		return fmt.Errorf("engine: generate: TopLogProbs %d: want a number in [0, %d]", opts.TopLogProbs, MaxTopLogProbs)
	}
	if len(opts.StopStrings) > 0 && m.tok == nil {
		return fmt.Errorf("engine: generate: StopStrings need the model's text: %w", ErrNoTokenizer)
	}
	return nil
}

// picker returns a function that appends tokens to the session, runs them
// and picks the token that follows. When the model can leave its logits on
// the backend and the backend samples (backend.TokenSampler) with these
// options (greedy, or temperature with top-k alone), the token is picked
// there and only its id comes back; otherwise the logits come to the host and
// sampler picks. Either way sampler's random stream is used alike, one draw
// a pick in order.
//
// Where the backend can also keep the pick on the device
// (backend.TokenPipeliner, model.SampledForwarder) and more is set, the run
// of the picked token (and its own pick) is queued before its id is read
// back, so the device goes on while the id travels and the host streams it;
// the next call, with that token, then only waits for the pick queued ahead.
// The session's cache then holds one position more than its tokens until
// that call: Generate keeps the token or truncates the cache.
//
// The function returns the token's ID, and its log-probabilities when lp
// asks for them: those need the logits on the host, so they take the host
// path whatever the backend offers.
func (s *Session) picker(sampler *Sampler, lp logProbOptions, con Constraint) func(ctx context.Context, tokens []int, more bool) (Token, error) {
	df, forwards := s.m.net.(model.DeviceForwarder)
	ts := s.m.caps.Sampler
	samples := ts != nil
	o := sampler.opts
	var raw []float32 // the logits before Sample changes them
	host := func(ctx context.Context, tokens []int, _ bool) (Token, error) {
		logits, err := s.appendHost(ctx, tokens)
		if err != nil {
			return Token{}, err
		}
		if i := firstNaN(logits); i >= 0 {
			return Token{}, fmt.Errorf("engine: logit %d at position %d is NaN (a weight or config value out of range?); no token drawn",
				i, len(s.tokens)-1)
		}
		if lp.want {
			raw = append(raw[:0], logits...)
		}
		if con != nil {
			con.Mask(logits)
			if !slices.ContainsFunc(logits, func(v float32) bool { return !math.IsInf(float64(v), -1) }) {
				return Token{}, fmt.Errorf("engine: the constraint allows no token at position %d", len(s.tokens))
			}
		}
		t := Token{ID: sampler.Sample(logits, s.tokens)}
		if con != nil {
			con.Accept(t.ID)
		}
		if lp.want {
			t.LogProb, t.TopLogProbs = logProbs(raw, t.ID, lp.top)
		}
		return t, nil
	}
	if d := s.m.drafter(); d != nil && !lp.want && con == nil && s.m.sched == nil {
		return s.specPicker(sampler, d, host)
	}
	if !forwards || !samples || !o.onDevice() || lp.want || con != nil {
		return host
	}
	device := s.devicePicker(sampler, df, ts)
	if s.m.sched == nil {
		return device
	}
	// While other sessions generate, the step is batched with theirs and
	// the token picked with theirs on the device where the backend picks
	// batches (backend.BatchTokenSampler), else on the host; alone, it is
	// picked on the device.
	return func(ctx context.Context, tokens []int, more bool) (Token, error) {
		if s.m.sched.crowded() {
			if s.m.sched.picksOnDevice() {
				return s.pickBatched(ctx, tokens, sampler)
			}
			return host(ctx, tokens, more)
		}
		return device(ctx, tokens, more)
	}
}

// pickBatched appends tokens to the session through the scheduler's
// batched steps, the next token picked on the device with the others of
// its step (scheduler.forwardPick), one draw of sampler's random stream a
// pick as on every other path.
func (s *Session) pickBatched(ctx context.Context, tokens []int, sampler *Sampler) (Token, error) {
	o := sampler.opts
	p := backend.SamplePick{Temperature: float32(o.Temperature), TopK: o.TopK}
	if o.Temperature > 0 {
		p.U = sampler.rng.Float64()
	}
	if s.st.Len() > len(s.tokens) { // a run queued ahead (picker) that is not kept
		s.st.Truncate(len(s.tokens))
	}
	var id int
	err := s.run(ctx, tokens, func(ids []int32) (err error) {
		id, err = s.m.sched.forwardPick(ctx, s.st, ids, p)
		return err
	})
	return Token{ID: id}, err
}

// devicePicker is picker's function for a backend that picks the token
// where the logits are.
func (s *Session) devicePicker(sampler *Sampler, df model.DeviceForwarder, ts backend.TokenSampler) func(ctx context.Context, tokens []int, more bool) (Token, error) {
	o := sampler.opts
	draw := func() float64 {
		if o.Temperature > 0 {
			return sampler.rng.Float64()
		}
		return 0
	}
	sf, forwardsHeld := s.m.net.(model.SampledForwarder)
	tp := s.m.caps.Pipeliner
	holds := tp != nil
	if !forwardsHeld || !holds || s.noAhead {
		return func(ctx context.Context, tokens []int, _ bool) (Token, error) {
			logits, err := s.appendDevice(ctx, tokens, df)
			if err != nil {
				return Token{}, err
			}
			id, err := ts.SampleToken(logits, float32(o.Temperature), o.TopK, draw())
			return Token{ID: id}, err
		}
	}
	var (
		ahead  backend.PendingToken // the pick after a token whose run is queued ahead
		aheadT = -1                 // that token (known once the call that queued it returned it)
	)
	return func(ctx context.Context, tokens []int, more bool) (Token, error) {
		if err := ctx.Err(); err != nil {
			return Token{}, err
		}
		if s.held == nil {
			s.held = s.m.backend.NewBuffer(1)
		}
		held := s.held
		var pick backend.PendingToken
		if ahead != nil && len(tokens) == 1 && tokens[0] == aheadT && s.st.Len() == len(s.tokens)+1 {
			// tokens[0] ran ahead: the session takes it, its pick is queued.
			s.tokens = append(s.tokens, aheadT)
			pick, ahead = ahead, nil
		} else {
			ahead = nil
			if s.st.Len() > len(s.tokens) {
				s.st.Truncate(len(s.tokens))
			}
			logits, err := s.appendDevice(ctx, tokens, df)
			if err != nil {
				return Token{}, err
			}
			if pick, err = tp.SampleTokenTo(held, logits, float32(o.Temperature), o.TopK, draw()); err != nil {
				return Token{}, err
			}
		}
		if more && s.st.Len() < s.st.Cap() {
			// Queue the run of the token being picked, and its own pick.
			logits, err := sf.ForwardSampled(ctx, s.st, held)
			if err == nil {
				ahead, err = tp.SampleTokenTo(held, logits, float32(o.Temperature), o.TopK, draw())
			}
			if err != nil {
				ahead = nil
				s.st.Truncate(len(s.tokens))
				return Token{}, err
			}
		}
		id, err := pick.Wait()
		if err != nil {
			ahead = nil
			return Token{}, err
		}
		aheadT = id
		return Token{ID: id}, nil
	}
}

// firstNaN returns the index of the first NaN in logits, or -1.
func firstNaN(logits []float32) int {
	for i, v := range logits {
		if v != v {
			return i
		}
	}
	return -1
}
