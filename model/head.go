package model

import "github.com/manifoldlm/manifold/backend"

// head is what the HuggingFace-layout decoders share at their two ends: the
// token embedding, the final norm and the LM head (the embedding itself when
// the config ties them and the checkpoint has no lm_head).
type head struct {
	Embed  backend.Weight // [vocab, hidden]
	Norm   backend.Buffer // final RMSNorm
	LMHead backend.Weight // [vocab, hidden]
}

// loadHead reads model.embed_tokens, model.norm and lm_head.
func loadHead(l *Loader, cfg *Config) (head, error) {
	var hd head
	var err error
	if hd.Embed, err = l.Matrix("model.embed_tokens.weight", cfg.VocabSize, cfg.HiddenSize); err != nil {
		return hd, err
	}
	if hd.Norm, err = l.Vector("model.norm.weight", cfg.HiddenSize); err != nil {
		return hd, err
	}
	hd.LMHead = hd.Embed
	if !cfg.TieWordEmbeddings || l.Has("lm_head.weight") {
		hd.LMHead, err = l.Linear("lm_head", cfg.VocabSize, cfg.HiddenSize)
	}
	return hd, err
}

// logits normalizes the n rows of hidden states x (the last one only unless
// all is set) and applies the LM head into out, a buffer of at least n rows
// of vocabulary size; h is scratch of x's size. It returns the logits' view.
func (hd *head) logits(b backend.Backend, cfg *Config, x, h, out backend.Buffer, n int, all bool) backend.Buffer {
	H, rows := cfg.HiddenSize, n
	if !all {
		rows, x, h = 1, b.View(x, (n-1)*H, H), b.View(h, (n-1)*H, H)
	}
	b.RMSNorm(h, x, hd.Norm, cfg.RMSNormEps)
	logits := b.View(out, 0, rows*cfg.VocabSize)
	b.MatMul(logits, h, hd.LMHead, rows)
	return logits
}
